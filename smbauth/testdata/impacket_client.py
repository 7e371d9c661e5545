# An NTLM client from impacket (Debian python3-impacket), driven over
# stdin/stdout by TestImpacketClient: it prints the NEGOTIATE, reads the
# CHALLENGE, prints the AUTHENTICATE and the exported session key, all in hex.
# Usage: impacket_client.py USER PASSWORD DOMAIN KEYEXCH(0|1)
import binascii
import sys

from impacket import ntlm

user, password, domain, keyexch = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
t1 = ntlm.getNTLMSSPType1("WORKSTATION", "", signingRequired=keyexch)
print(binascii.hexlify(t1.getData()).decode(), flush=True)
t2 = binascii.unhexlify(sys.stdin.readline().strip())
t3, key = ntlm.getNTLMSSPType3(t1, t2, user, password, domain)
print(binascii.hexlify(t3.getData()).decode(), flush=True)
print(binascii.hexlify(key).decode(), flush=True)
