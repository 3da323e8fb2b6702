/* shm_util.c: same-host regions by hand (shm_util.h). */
#include "shm_util.h"

#include "client_internal.h"

int shm_register_pending(tport_client *c, uint64_t nbytes, tport_err *err)
{
  Tport__ShmRegisterRequest q = TPORT__SHM_REGISTER_REQUEST__INIT;
  q.nbytes = nbytes;
  Tport__ShmRegisterReply *a;
  int rc = client_rpc(c, TPORT__METHOD__METHOD_SHM_REGISTER, &q.base, NULL, 0,
                      &tport__shm_register_reply__descriptor, (ProtobufCMessage **)&a, NULL, err);
  if (!rc)
    protobuf_c_message_free_unpacked(&a->base, NULL);
  return rc;
}
