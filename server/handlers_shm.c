/*
 * handlers_shm.c: ShmRegister and ShmRelease, the nng half of same-host
 * regions (the descriptor itself goes over the shm socket: regions.h), and
 * of CUDA IPC regions (a client's GPU allocation: regions.h too).
 */
#include <string.h>
#include <unistd.h>

#include "wire.h"

/* The process at the other end of a connection, where the transport knows
 * it: an ipc:// peer (SO_PEERCRED, through nng) or this very process
 * (inproc://); 0 over tcp://. */
static pid_t peer_pid(uint32_t pipe)
{
  nng_pipe p = {.id = pipe};
  uint64_t pid = 0;
  if (nng_pipe_get_uint64(p, NNG_OPT_IPC_PEER_PID, &pid) == 0 && pid > 0)
    return (pid_t)pid;
  nng_sockaddr sa;
  if (nng_pipe_get_addr(p, NNG_OPT_REMADDR, &sa) == 0 && sa.s_family == NNG_AF_INPROC)
    return getpid();
  return 0;
}

/* The user of that process (ipc://: SO_PEERCRED; inproc://: tportd's);
 * false where the transport does not say. */
static bool peer_uid(uint32_t pipe, uid_t *uid)
{
  nng_pipe p = {.id = pipe};
  uint64_t u = 0;
  if (nng_pipe_get_uint64(p, NNG_OPT_IPC_PEER_UID, &u) == 0) {
    *uid = (uid_t)u;
    return (uint64_t)*uid == u;
  }
  nng_sockaddr sa;
  if (nng_pipe_get_addr(p, NNG_OPT_REMADDR, &sa) == 0 && sa.s_family == NNG_AF_INPROC) {
    *uid = geteuid();
    return true;
  }
  return false;
}

/* ShmRegister of the client's own memory (regions.h, process regions):
 * the first step (*ready false: token is what the client must write into
 * its memory), or, with process_probe_addr, the second (*ready). */
static int register_process(call *c, const Tport__ShmRegisterRequest *q, const char *tenant,
                            uint64_t *id, uint8_t *token, bool *ready)
{
  if (q->process_probe_addr) {
    *id = q->process_region;
    *ready = true;
    return shm_confirm_process(c->srv->shm, c->pipe, q->process_region, q->process_probe_addr,
                               &c->err);
  }
  uid_t uid = (uid_t)-1;
  pid_t pid = peer_uid(c->pipe, &uid) ? peer_pid(c->pipe) : 0;
  return shm_register_process(c->srv->shm, c->pipe, tenant, pid, uid, id, token, &c->err);
}

int h_shm_register(call *c)
{
  Tport__ShmRegisterRequest *q = (Tport__ShmRegisterRequest *)c->req;
  server *s = c->srv;
  if (!s->shm)
    return tport_err_set(&c->err, TPORT_FAILED_PRECONDITION,
                         "this server offers no shared memory (--shm-socket off, or its socket "
                         "could not be opened)");
  if (!server_peer_is_local(c->pipe))
    return tport_err_set(&c->err, TPORT_FAILED_PRECONDITION,
                         "shared memory is for clients on this host (ipc://, inproc://, or tcp:// "
                         "on loopback)");
  char tenant[REG_TENANT_MAX];
  if (!reg_session_tenant(&s->reg, c->pipe, tenant, sizeof tenant))
    return tport_err_set(&c->err, TPORT_ABORTED, "the connection is closing");
  uint64_t id;
  uint8_t token[TRANSPORT_SHM_TOKEN_BYTES];
  bool ready = false;
  bool ipc = q->cuda_ipc_handle.len > 0 || q->cuda_ipc_fd;
  if (q->process && ipc)
    return tport_err_set(&c->err, TPORT_INVALID_ARGUMENT,
                         "a region is the client's memory or a CUDA allocation, not both");
  int rc;
  if (q->process)
    rc = register_process(c, q, tenant, &id, token, &ready);
  else if (ipc)
    rc = shm_register_ipc(s->shm, c->pipe, tenant, peer_pid(c->pipe), q->nbytes,
                          q->cuda_ipc_handle.data, q->cuda_ipc_handle.len, q->cuda_ipc_fd, &id,
                          token, &ready, &c->err);
  else
    rc = shm_register(s->shm, c->pipe, tenant, peer_pid(c->pipe), q->nbytes, &id, token, &c->err);
  if (rc)
    return rc;
  /* a connection that closed meanwhile has had its regions dropped already
   * (its session goes first): this one would outlive it */
  if (!reg_session_tenant(&s->reg, c->pipe, tenant, sizeof tenant)) {
    tport_err ignored;
    shm_release(s->shm, c->pipe, id, &ignored);
    return tport_err_set(&c->err, TPORT_ABORTED, "the connection is closing");
  }
  Tport__ShmRegisterReply r = TPORT__SHM_REGISTER_REPLY__INIT;
  r.status = wire_ok();
  r.region = id;
  r.token.data = token;
  r.token.len = ready ? 0 : sizeof token;
  r.socket_path = (char *)shm_socket_path(s->shm);
  r.ready = ready;
  return call_reply(c, &r.base, NULL, 0);
}

int h_shm_release(call *c)
{
  Tport__ShmReleaseRequest *q = (Tport__ShmReleaseRequest *)c->req;
  server *s = c->srv;
  if (!s->shm)
    return tport_err_set(&c->err, TPORT_NOT_FOUND, "this server offers no shared memory");
  int rc = shm_release(s->shm, c->pipe, q->region, &c->err);
  if (rc)
    return rc;
  Tport__ShmReleaseReply r = TPORT__SHM_RELEASE_REPLY__INIT;
  r.status = wire_ok();
  return call_reply(c, &r.base, NULL, 0);
}
