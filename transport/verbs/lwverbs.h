// lwverbs.h declares the small C layer between Go and libibverbs/librdmacm.
// The libraries are loaded with dlopen at run time (lwv_load), so a binary
// built with verbs support starts on a host without rdma-core's runtime
// libraries. Only the types and the static inline data-path functions of the
// headers are used at build time; every exported symbol is reached through a
// pointer filled in by lwv_load.
#ifndef LWVERBS_H
#define LWVERBS_H

#include <stdint.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

// lwv_load dlopens libibverbs.so.1 and librdmacm.so.1 and resolves every
// symbol used. It returns 0, or -1 with a message in lwv_load_error().
int lwv_load(void);
const char *lwv_load_error(void);

// Devices.
int lwv_device_count(void);

// Event channels (rdma_cm) and completion channels: created non-blocking so
// Go's poller can wait on them.
struct rdma_event_channel *lwv_create_event_channel(void);
void lwv_destroy_event_channel(struct rdma_event_channel *ch);
int lwv_event_channel_fd(struct rdma_event_channel *ch);

// lwv_cm_event is one rdma_cm event, copied out and already acknowledged.
struct lwv_cm_event {
	struct rdma_cm_id *id;
	struct rdma_cm_id *listen_id;
	int event;
	int status;
};
// lwv_get_cm_event returns 0 with *out filled, or -errno (-EAGAIN: none).
int lwv_get_cm_event(struct rdma_event_channel *ch, struct lwv_cm_event *out);
const char *lwv_event_str(int event);

int lwv_create_id(struct rdma_event_channel *ch, struct rdma_cm_id **id);
int lwv_destroy_id(struct rdma_cm_id *id);
int lwv_migrate_id(struct rdma_cm_id *id, struct rdma_event_channel *ch);

// Addresses are passed as (family, 16 address bytes, port).
int lwv_bind(struct rdma_cm_id *id, int family, const uint8_t *ip, uint16_t port);
int lwv_resolve_addr(struct rdma_cm_id *id, int family, const uint8_t *ip, uint16_t port, int timeout_ms);
int lwv_resolve_route(struct rdma_cm_id *id, int timeout_ms);
int lwv_listen(struct rdma_cm_id *id, int backlog);
// lwv_addr reads the local (which=0) or peer (which=1) address of id.
int lwv_addr(struct rdma_cm_id *id, int which, uint8_t *ip, uint16_t *port);
struct ibv_context *lwv_id_verbs(struct rdma_cm_id *id);
const char *lwv_context_name(struct ibv_context *ctx);

int lwv_connect(struct rdma_cm_id *id, uint8_t retry, uint8_t rnr_retry);
int lwv_accept(struct rdma_cm_id *id, uint8_t rnr_retry);
int lwv_reject(struct rdma_cm_id *id);
int lwv_disconnect(struct rdma_cm_id *id);

// Protection domains and memory regions.
struct ibv_pd *lwv_alloc_pd(struct ibv_context *ctx);
int lwv_dealloc_pd(struct ibv_pd *pd);
struct ibv_mr *lwv_reg_mr(struct ibv_pd *pd, void *addr, size_t len, int remote_write);
int lwv_dereg_mr(struct ibv_mr *mr);

// Completion queues.
struct ibv_comp_channel *lwv_create_comp_channel(struct ibv_context *ctx);
int lwv_destroy_comp_channel(struct ibv_comp_channel *cc);
int lwv_comp_channel_fd(struct ibv_comp_channel *cc);
struct ibv_cq *lwv_create_cq(struct ibv_context *ctx, int cqe, struct ibv_comp_channel *cc);
int lwv_destroy_cq(struct ibv_cq *cq);
int lwv_req_notify(struct ibv_cq *cq);
// lwv_get_cq_event consumes and acknowledges one completion event: 0, or
// -errno (-EAGAIN: none pending).
int lwv_get_cq_event(struct ibv_comp_channel *cc);

// Queue pairs. send_cq and recv_cq may be the same; with an srq the queue
// pair takes its receives from it and recv_depth is ignored.
int lwv_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd, struct ibv_cq *send_cq,
		  struct ibv_cq *recv_cq, struct ibv_srq *srq,
		  int send_depth, int recv_depth, int max_sge);
uint32_t lwv_qp_num(struct ibv_qp *qp);
void lwv_destroy_qp(struct rdma_cm_id *id);
struct ibv_qp *lwv_id_qp(struct rdma_cm_id *id);
int lwv_set_min_rnr_timer(struct ibv_qp *qp, uint8_t timer);
int lwv_qp_to_error(struct ibv_qp *qp);

// Data path: flat descriptions that one call turns into a chain of work
// requests and posts, so a batch costs one cgo crossing.
enum { LWV_SEND = 1, LWV_WRITE = 2, LWV_WRITE_IMM = 3, LWV_SEND_IMM = 4 };
struct lwv_sge {
	uint64_t addr;
	uint32_t length;
	uint32_t lkey;
};
struct lwv_swr {
	uint64_t wr_id;
	uint64_t remote_addr;
	uint32_t rkey;
	uint32_t imm;  // host order; converted to network order here
	int32_t op;    // LWV_*
	int32_t nsge;  // segments taken in order from the sge array
};
struct lwv_rwr {
	uint64_t wr_id;
	struct lwv_sge sge;
};
// lwv_post_send posts n requests; wrs/sges is caller-owned staging space for
// at least n work requests and the total of their segments. It returns 0 or
// an errno from the provider (nothing or a prefix posted: see *bad).
int lwv_post_send(struct ibv_qp *qp, const struct lwv_swr *w, int n, const struct lwv_sge *sg,
		  struct ibv_send_wr *wrs, struct ibv_sge *sges, int *bad);
int lwv_post_recv(struct ibv_qp *qp, const struct lwv_rwr *w, int n,
		  struct ibv_recv_wr *wrs, struct ibv_sge *sges, int *bad);

// Shared receive queues (one SGE per receive).
struct ibv_srq *lwv_create_srq(struct ibv_pd *pd, int max_wr);
int lwv_destroy_srq(struct ibv_srq *srq);
// lwv_srq_limit arms (limit > 0) or disarms the SRQ limit event.
int lwv_srq_limit(struct ibv_srq *srq, int limit);
int lwv_post_srq_recv(struct ibv_srq *srq, const struct lwv_rwr *w, int n,
		      struct ibv_recv_wr *wrs, struct ibv_sge *sges, int *bad);

// Asynchronous events of a device context: its fd is made non-blocking so
// Go's poller can wait on it; lwv_get_async_event copies one event out and
// acknowledges it (0, or -errno: -EAGAIN none pending).
int lwv_async_fd(struct ibv_context *ctx);
struct lwv_async_event {
	int type;             // enum ibv_event_type
	struct ibv_srq *srq;  // SRQ events
	struct ibv_qp *qp;    // QP events
	struct ibv_cq *cq;    // CQ events
};
int lwv_get_async_event(struct ibv_context *ctx, struct lwv_async_event *out);
const char *lwv_event_type_str(int type);

struct lwv_wc {
	uint64_t wr_id;
	uint32_t qp_num;   // the queue pair it belongs to
	uint32_t status;   // enum ibv_wc_status
	uint32_t opcode;   // enum ibv_wc_opcode (valid on success only)
	uint32_t byte_len;
	uint32_t imm;      // host order
	uint32_t has_imm;
	uint32_t vendor_err;
};
// lwv_poll reaps up to n completions into out (one cgo call per batch).
int lwv_poll(struct ibv_cq *cq, struct lwv_wc *out, int n, struct ibv_wc *scratch);
const char *lwv_wc_status_str(int status);

#endif
