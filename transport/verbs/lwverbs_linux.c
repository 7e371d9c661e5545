//go:build linux && cgo && !noverbs

// lwverbs_linux.c: see lwverbs.h. No symbol of libibverbs or librdmacm is
// linked; they are resolved by dlopen/dlsym in lwv_load.
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "lwverbs.h"

static void recv_chain(const struct lwv_rwr *w, int n, struct ibv_recv_wr *wrs, struct ibv_sge *sges);

static struct ibv_device **(*p_ibv_get_device_list)(int *);
static void (*p_ibv_free_device_list)(struct ibv_device **);
static struct ibv_pd *(*p_ibv_alloc_pd)(struct ibv_context *);
static int (*p_ibv_dealloc_pd)(struct ibv_pd *);
static struct ibv_mr *(*p_ibv_reg_mr)(struct ibv_pd *, void *, size_t, int);
static int (*p_ibv_dereg_mr)(struct ibv_mr *);
static struct ibv_comp_channel *(*p_ibv_create_comp_channel)(struct ibv_context *);
static int (*p_ibv_destroy_comp_channel)(struct ibv_comp_channel *);
static struct ibv_cq *(*p_ibv_create_cq)(struct ibv_context *, int, void *, struct ibv_comp_channel *, int);
static int (*p_ibv_destroy_cq)(struct ibv_cq *);
static int (*p_ibv_get_cq_event)(struct ibv_comp_channel *, struct ibv_cq **, void **);
static void (*p_ibv_ack_cq_events)(struct ibv_cq *, unsigned int);
static int (*p_ibv_modify_qp)(struct ibv_qp *, struct ibv_qp_attr *, int);
static const char *(*p_ibv_wc_status_str)(enum ibv_wc_status);
static const char *(*p_ibv_get_device_name)(struct ibv_device *);
static struct ibv_srq *(*p_ibv_create_srq)(struct ibv_pd *, struct ibv_srq_init_attr *);
static int (*p_ibv_destroy_srq)(struct ibv_srq *);
static int (*p_ibv_modify_srq)(struct ibv_srq *, struct ibv_srq_attr *, int);
static int (*p_ibv_get_async_event)(struct ibv_context *, struct ibv_async_event *);
static void (*p_ibv_ack_async_event)(struct ibv_async_event *);
static const char *(*p_ibv_event_type_str)(enum ibv_event_type);

static struct rdma_event_channel *(*p_rdma_create_event_channel)(void);
static void (*p_rdma_destroy_event_channel)(struct rdma_event_channel *);
static int (*p_rdma_create_id)(struct rdma_event_channel *, struct rdma_cm_id **, void *, enum rdma_port_space);
static int (*p_rdma_destroy_id)(struct rdma_cm_id *);
static int (*p_rdma_migrate_id)(struct rdma_cm_id *, struct rdma_event_channel *);
static int (*p_rdma_bind_addr)(struct rdma_cm_id *, struct sockaddr *);
static int (*p_rdma_resolve_addr)(struct rdma_cm_id *, struct sockaddr *, struct sockaddr *, int);
static int (*p_rdma_resolve_route)(struct rdma_cm_id *, int);
static int (*p_rdma_listen)(struct rdma_cm_id *, int);
static int (*p_rdma_create_qp)(struct rdma_cm_id *, struct ibv_pd *, struct ibv_qp_init_attr *);
static void (*p_rdma_destroy_qp)(struct rdma_cm_id *);
static int (*p_rdma_connect)(struct rdma_cm_id *, struct rdma_conn_param *);
static int (*p_rdma_accept)(struct rdma_cm_id *, struct rdma_conn_param *);
static int (*p_rdma_reject)(struct rdma_cm_id *, const void *, uint8_t);
static int (*p_rdma_disconnect)(struct rdma_cm_id *);
static int (*p_rdma_get_cm_event)(struct rdma_event_channel *, struct rdma_cm_event **);
static int (*p_rdma_ack_cm_event)(struct rdma_cm_event *);
static const char *(*p_rdma_event_str)(enum rdma_cm_event_type);

struct sym {
	int lib; // 0 libibverbs, 1 librdmacm
	const char *name;
	void **fn;
};

#define S(lib, name) { lib, #name, (void **)&p_##name }
static const struct sym syms[] = {
	S(0, ibv_get_device_list), S(0, ibv_free_device_list), S(0, ibv_alloc_pd),
	S(0, ibv_dealloc_pd), S(0, ibv_reg_mr), S(0, ibv_dereg_mr),
	S(0, ibv_create_comp_channel), S(0, ibv_destroy_comp_channel), S(0, ibv_create_cq),
	S(0, ibv_destroy_cq), S(0, ibv_get_cq_event), S(0, ibv_ack_cq_events),
	S(0, ibv_modify_qp), S(0, ibv_wc_status_str), S(0, ibv_get_device_name),
	S(0, ibv_create_srq), S(0, ibv_destroy_srq), S(0, ibv_modify_srq),
	S(0, ibv_get_async_event), S(0, ibv_ack_async_event), S(0, ibv_event_type_str),
	S(1, rdma_create_event_channel), S(1, rdma_destroy_event_channel), S(1, rdma_create_id),
	S(1, rdma_destroy_id), S(1, rdma_migrate_id), S(1, rdma_bind_addr),
	S(1, rdma_resolve_addr), S(1, rdma_resolve_route), S(1, rdma_listen),
	S(1, rdma_create_qp), S(1, rdma_destroy_qp), S(1, rdma_connect), S(1, rdma_accept),
	S(1, rdma_reject), S(1, rdma_disconnect), S(1, rdma_get_cm_event),
	S(1, rdma_ack_cm_event), S(1, rdma_event_str),
};
#undef S

static char load_err[512];

int lwv_load(void)
{
	static const char *names[2] = { "libibverbs.so.1", "librdmacm.so.1" };
	void *libs[2];
	for (int i = 0; i < 2; i++) {
		libs[i] = dlopen(names[i], RTLD_NOW | RTLD_GLOBAL);
		if (!libs[i]) {
			snprintf(load_err, sizeof load_err, "%s", dlerror());
			return -1;
		}
	}
	for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
		*syms[i].fn = dlsym(libs[syms[i].lib], syms[i].name);
		if (!*syms[i].fn) {
			snprintf(load_err, sizeof load_err, "%s: symbol %s not found",
				 names[syms[i].lib], syms[i].name);
			return -1;
		}
	}
	return 0;
}

const char *lwv_load_error(void) { return load_err; }

int lwv_device_count(void)
{
	int n = 0;
	struct ibv_device **l = p_ibv_get_device_list(&n);
	if (!l)
		return -errno;
	p_ibv_free_device_list(l);
	return n;
}

static int set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return -errno;
	return 0;
}

struct rdma_event_channel *lwv_create_event_channel(void)
{
	struct rdma_event_channel *ch = p_rdma_create_event_channel();
	if (ch && set_nonblock(ch->fd) < 0) {
		int e = errno;
		p_rdma_destroy_event_channel(ch);
		errno = e;
		return NULL;
	}
	return ch;
}

void lwv_destroy_event_channel(struct rdma_event_channel *ch) { p_rdma_destroy_event_channel(ch); }
int lwv_event_channel_fd(struct rdma_event_channel *ch) { return ch->fd; }

int lwv_get_cm_event(struct rdma_event_channel *ch, struct lwv_cm_event *out)
{
	struct rdma_cm_event *ev;
	if (p_rdma_get_cm_event(ch, &ev))
		return -errno;
	out->id = ev->id;
	out->listen_id = ev->listen_id;
	out->event = ev->event;
	out->status = ev->status;
	p_rdma_ack_cm_event(ev);
	return 0;
}

const char *lwv_event_str(int event) { return p_rdma_event_str((enum rdma_cm_event_type)event); }

int lwv_create_id(struct rdma_event_channel *ch, struct rdma_cm_id **id)
{
	return p_rdma_create_id(ch, id, NULL, RDMA_PS_TCP) ? -errno : 0;
}

int lwv_destroy_id(struct rdma_cm_id *id) { return p_rdma_destroy_id(id) ? -errno : 0; }

int lwv_migrate_id(struct rdma_cm_id *id, struct rdma_event_channel *ch)
{
	return p_rdma_migrate_id(id, ch) ? -errno : 0;
}

static socklen_t mksa(struct sockaddr_storage *ss, int family, const uint8_t *ip, uint16_t port)
{
	memset(ss, 0, sizeof *ss);
	if (family == AF_INET) {
		struct sockaddr_in *sin = (struct sockaddr_in *)ss;
		sin->sin_family = AF_INET;
		sin->sin_port = htons(port);
		memcpy(&sin->sin_addr, ip, 4);
		return sizeof *sin;
	}
	struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)ss;
	sin6->sin6_family = AF_INET6;
	sin6->sin6_port = htons(port);
	memcpy(&sin6->sin6_addr, ip, 16);
	return sizeof *sin6;
}

int lwv_bind(struct rdma_cm_id *id, int family, const uint8_t *ip, uint16_t port)
{
	struct sockaddr_storage ss;
	mksa(&ss, family, ip, port);
	return p_rdma_bind_addr(id, (struct sockaddr *)&ss) ? -errno : 0;
}

int lwv_resolve_addr(struct rdma_cm_id *id, int family, const uint8_t *ip, uint16_t port, int timeout_ms)
{
	struct sockaddr_storage ss;
	mksa(&ss, family, ip, port);
	return p_rdma_resolve_addr(id, NULL, (struct sockaddr *)&ss, timeout_ms) ? -errno : 0;
}

int lwv_resolve_route(struct rdma_cm_id *id, int timeout_ms)
{
	return p_rdma_resolve_route(id, timeout_ms) ? -errno : 0;
}

int lwv_listen(struct rdma_cm_id *id, int backlog) { return p_rdma_listen(id, backlog) ? -errno : 0; }

int lwv_addr(struct rdma_cm_id *id, int which, uint8_t *ip, uint16_t *port)
{
	struct sockaddr *sa = which ? rdma_get_peer_addr(id) : rdma_get_local_addr(id);
	if (sa->sa_family == AF_INET) {
		struct sockaddr_in *sin = (struct sockaddr_in *)sa;
		memcpy(ip, &sin->sin_addr, 4);
		*port = ntohs(sin->sin_port);
		return AF_INET;
	}
	if (sa->sa_family == AF_INET6) {
		struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)sa;
		memcpy(ip, &sin6->sin6_addr, 16);
		*port = ntohs(sin6->sin6_port);
		return AF_INET6;
	}
	return 0;
}

struct ibv_context *lwv_id_verbs(struct rdma_cm_id *id) { return id->verbs; }

const char *lwv_context_name(struct ibv_context *ctx) { return p_ibv_get_device_name(ctx->device); }

int lwv_connect(struct rdma_cm_id *id, uint8_t retry, uint8_t rnr_retry)
{
	struct rdma_conn_param p;
	memset(&p, 0, sizeof p);
	p.responder_resources = 1;
	p.initiator_depth = 1;
	p.retry_count = retry;
	p.rnr_retry_count = rnr_retry;
	return p_rdma_connect(id, &p) ? -errno : 0;
}

int lwv_accept(struct rdma_cm_id *id, uint8_t rnr_retry)
{
	struct rdma_conn_param p;
	memset(&p, 0, sizeof p);
	p.responder_resources = 1;
	p.initiator_depth = 1;
	p.rnr_retry_count = rnr_retry;
	return p_rdma_accept(id, &p) ? -errno : 0;
}

int lwv_reject(struct rdma_cm_id *id) { return p_rdma_reject(id, NULL, 0) ? -errno : 0; }
int lwv_disconnect(struct rdma_cm_id *id) { return p_rdma_disconnect(id) ? -errno : 0; }

struct ibv_pd *lwv_alloc_pd(struct ibv_context *ctx) { return p_ibv_alloc_pd(ctx); }
int lwv_dealloc_pd(struct ibv_pd *pd) { return p_ibv_dealloc_pd(pd); }

struct ibv_mr *lwv_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int remote_write)
{
	int access = IBV_ACCESS_LOCAL_WRITE;
	if (remote_write)
		access |= IBV_ACCESS_REMOTE_WRITE;
	return p_ibv_reg_mr(pd, addr, len, access);
}

int lwv_dereg_mr(struct ibv_mr *mr) { return p_ibv_dereg_mr(mr); }

struct ibv_comp_channel *lwv_create_comp_channel(struct ibv_context *ctx)
{
	struct ibv_comp_channel *cc = p_ibv_create_comp_channel(ctx);
	if (cc && set_nonblock(cc->fd) < 0) {
		int e = errno;
		p_ibv_destroy_comp_channel(cc);
		errno = e;
		return NULL;
	}
	return cc;
}

int lwv_destroy_comp_channel(struct ibv_comp_channel *cc) { return p_ibv_destroy_comp_channel(cc); }
int lwv_comp_channel_fd(struct ibv_comp_channel *cc) { return cc->fd; }

struct ibv_cq *lwv_create_cq(struct ibv_context *ctx, int cqe, struct ibv_comp_channel *cc)
{
	return p_ibv_create_cq(ctx, cqe, NULL, cc, 0);
}

int lwv_destroy_cq(struct ibv_cq *cq) { return p_ibv_destroy_cq(cq); }
int lwv_req_notify(struct ibv_cq *cq) { return ibv_req_notify_cq(cq, 0); }

int lwv_get_cq_event(struct ibv_comp_channel *cc)
{
	struct ibv_cq *cq;
	void *ctx;
	if (p_ibv_get_cq_event(cc, &cq, &ctx))
		return -errno;
	p_ibv_ack_cq_events(cq, 1);
	return 0;
}

int lwv_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_cq *send_cq,
		  struct ibv_cq *recv_cq, struct ibv_srq *srq,
		  int send_depth, int recv_depth, int max_sge)
{
	struct ibv_qp_init_attr a;
	memset(&a, 0, sizeof a);
	a.send_cq = send_cq;
	a.recv_cq = recv_cq;
	a.srq = srq;
	a.qp_type = IBV_QPT_RC;
	a.sq_sig_all = 1;
	a.cap.max_send_wr = send_depth;
	a.cap.max_recv_wr = srq ? 0 : recv_depth;
	a.cap.max_send_sge = max_sge;
	a.cap.max_recv_sge = srq ? 0 : 1;
	return p_rdma_create_qp(id, pd, &a) ? -errno : 0;
}

uint32_t lwv_qp_num(struct ibv_qp *qp) { return qp->qp_num; }

struct ibv_srq *lwv_create_srq(struct ibv_pd *pd, int max_wr)
{
	struct ibv_srq_init_attr a;
	memset(&a, 0, sizeof a);
	a.attr.max_wr = max_wr;
	a.attr.max_sge = 1;
	return p_ibv_create_srq(pd, &a);
}

int lwv_destroy_srq(struct ibv_srq *srq) { return p_ibv_destroy_srq(srq); }

int lwv_srq_limit(struct ibv_srq *srq, int limit)
{
	struct ibv_srq_attr a;
	memset(&a, 0, sizeof a);
	a.srq_limit = limit;
	return p_ibv_modify_srq(srq, &a, IBV_SRQ_LIMIT);
}

int lwv_post_srq_recv(struct ibv_srq *srq, const struct lwv_rwr *w, int n,
		      struct ibv_recv_wr *wrs, struct ibv_sge *sges, int *bad)
{
	recv_chain(w, n, wrs, sges);
	struct ibv_recv_wr *badwr = NULL;
	int ret = ibv_post_srq_recv(srq, wrs, &badwr);
	*bad = badwr ? (int)(badwr - wrs) : -1;
	return ret;
}

int lwv_async_fd(struct ibv_context *ctx)
{
	if (set_nonblock(ctx->async_fd) < 0)
		return -errno;
	return ctx->async_fd;
}

int lwv_get_async_event(struct ibv_context *ctx, struct lwv_async_event *out)
{
	struct ibv_async_event ev;
	if (p_ibv_get_async_event(ctx, &ev))
		return -errno;
	memset(out, 0, sizeof *out);
	out->type = ev.event_type;
	switch (ev.event_type) {
	case IBV_EVENT_SRQ_LIMIT_REACHED:
	case IBV_EVENT_SRQ_ERR:
		out->srq = ev.element.srq;
		break;
	case IBV_EVENT_CQ_ERR:
		out->cq = ev.element.cq;
		break;
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_COMM_EST:
	case IBV_EVENT_SQ_DRAINED:
	case IBV_EVENT_PATH_MIG:
	case IBV_EVENT_PATH_MIG_ERR:
	case IBV_EVENT_QP_LAST_WQE_REACHED:
		out->qp = ev.element.qp;
		break;
	default:
		break;
	}
	p_ibv_ack_async_event(&ev);
	return 0;
}

const char *lwv_event_type_str(int type) { return p_ibv_event_type_str((enum ibv_event_type)type); }

void lwv_destroy_qp(struct rdma_cm_id *id) { p_rdma_destroy_qp(id); }
struct ibv_qp *lwv_id_qp(struct rdma_cm_id *id) { return id->qp; }

int lwv_set_min_rnr_timer(struct ibv_qp *qp, uint8_t timer)
{
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.min_rnr_timer = timer;
	return p_ibv_modify_qp(qp, &a, IBV_QP_MIN_RNR_TIMER);
}

int lwv_qp_to_error(struct ibv_qp *qp)
{
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_ERR;
	return p_ibv_modify_qp(qp, &a, IBV_QP_STATE);
}

int lwv_post_send(struct ibv_qp *qp, const struct lwv_swr *w, int n, const struct lwv_sge *sg,
		  struct ibv_send_wr *wrs, struct ibv_sge *sges, int *bad)
{
	int k = 0;
	for (int i = 0; i < n; i++) {
		struct ibv_send_wr *wr = &wrs[i];
		memset(wr, 0, sizeof *wr);
		wr->wr_id = w[i].wr_id;
		wr->next = i + 1 < n ? &wrs[i + 1] : NULL;
		wr->sg_list = &sges[k];
		wr->num_sge = w[i].nsge;
		wr->send_flags = IBV_SEND_SIGNALED;
		for (int j = 0; j < w[i].nsge; j++, k++) {
			sges[k].addr = sg[k].addr;
			sges[k].length = sg[k].length;
			sges[k].lkey = sg[k].lkey;
		}
		switch (w[i].op) {
		case LWV_SEND:
			wr->opcode = IBV_WR_SEND;
			break;
		case LWV_SEND_IMM:
			wr->opcode = IBV_WR_SEND_WITH_IMM;
			wr->imm_data = htonl(w[i].imm);
			break;
		case LWV_WRITE:
		case LWV_WRITE_IMM:
			wr->opcode = w[i].op == LWV_WRITE ? IBV_WR_RDMA_WRITE : IBV_WR_RDMA_WRITE_WITH_IMM;
			wr->imm_data = htonl(w[i].imm);
			wr->wr.rdma.remote_addr = w[i].remote_addr;
			wr->wr.rdma.rkey = w[i].rkey;
			break;
		default:
			return EINVAL;
		}
	}
	struct ibv_send_wr *badwr = NULL;
	int ret = ibv_post_send(qp, wrs, &badwr);
	*bad = badwr ? (int)(badwr - wrs) : -1;
	return ret;
}

// recv_chain turns n flat receive descriptions into a chain of work
// requests in the caller's staging memory.
static void recv_chain(const struct lwv_rwr *w, int n, struct ibv_recv_wr *wrs, struct ibv_sge *sges)
{
	for (int i = 0; i < n; i++) {
		memset(&wrs[i], 0, sizeof wrs[i]);
		wrs[i].wr_id = w[i].wr_id;
		wrs[i].next = i + 1 < n ? &wrs[i + 1] : NULL;
		sges[i].addr = w[i].sge.addr;
		sges[i].length = w[i].sge.length;
		sges[i].lkey = w[i].sge.lkey;
		wrs[i].sg_list = &sges[i];
		wrs[i].num_sge = 1;
	}
}

int lwv_post_recv(struct ibv_qp *qp, const struct lwv_rwr *w, int n,
		  struct ibv_recv_wr *wrs, struct ibv_sge *sges, int *bad)
{
	recv_chain(w, n, wrs, sges);
	struct ibv_recv_wr *badwr = NULL;
	int ret = ibv_post_recv(qp, wrs, &badwr);
	*bad = badwr ? (int)(badwr - wrs) : -1;
	return ret;
}

int lwv_poll(struct ibv_cq *cq, struct lwv_wc *out, int n, struct ibv_wc *scratch)
{
	int got = ibv_poll_cq(cq, n, scratch);
	for (int i = 0; i < got; i++) {
		out[i].wr_id = scratch[i].wr_id;
		out[i].qp_num = scratch[i].qp_num;
		out[i].status = scratch[i].status;
		out[i].opcode = scratch[i].opcode;
		out[i].byte_len = scratch[i].byte_len;
		out[i].has_imm = (scratch[i].wc_flags & IBV_WC_WITH_IMM) != 0;
		out[i].imm = out[i].has_imm ? ntohl(scratch[i].imm_data) : 0;
		out[i].vendor_err = scratch[i].vendor_err;
	}
	return got;
}

const char *lwv_wc_status_str(int status) { return p_ibv_wc_status_str((enum ibv_wc_status)status); }
