# bench/lib.sh: sourced (from the repository root) by the bench scripts
# that run a server of their own. They set bin (the binaries), work (its
# export/ is the share) and port before calling it.

# start_server SHARE USER LOG [ARG...]: lwio-server exporting $work/export
# as SHARE to USER (password $LWIO_PASSWORD, acting as root) on
# 127.0.0.1:$port (session) and $port+1 (softrdma), with ARGs, its output
# appended to LOG; sets server_pid and returns when the session port
# answers (10 s at most).
start_server() {
	local share=$1 user=$2 log=$3
	shift 3
	"$bin/lwio-server" -share "$share=$work/export" -listen 127.0.0.1:$port -soft 127.0.0.1:$((port + 1)) \
		-user "$user" -account root -allow-root -log-level warn "$@" >>"$log" 2>&1 &
	server_pid=$!
	for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done
}
