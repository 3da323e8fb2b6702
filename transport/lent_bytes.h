/*
 * lent_bytes.h: which transports send a message's lent bytes (nng_msg_set_tail
 * of deploy/nng/0008, the lent tail) straight from the lender's memory.
 *
 * tcp and ipc hand the tail to the kernel as an iov, tls+tcp to OpenSSL
 * (which encrypts it from there); every other transport (ws, inproc)
 * copies it into the message body first, which costs more than the
 * sender's own copy: there the sender copies instead.  Both
 * ends decide by the URL's scheme -- the client by the URL it dials, tportd
 * by that of the listener a connection came from (a ws:// connection's
 * address looks like a tcp one's, so the address cannot tell).
 */
#ifndef TPORT_TRANSPORT_LENT_BYTES_H
#define TPORT_TRANSPORT_LENT_BYTES_H

#include <stdbool.h>

/* Whether a connection to or from url sends lent bytes without a copy. */
bool transport_url_sends_lent_bytes(const char *url);

#endif
