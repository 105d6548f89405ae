/* SPDX-License-Identifier: BSD-3-Clause */
/* The request pipeline's entry points that only the core itself calls
 * (core/pipeline.c; docs/ARCHITECTURE.md, "The request path"): a worker
 * of the pool running a request, and bd_close()'s final flush. */
#ifndef BLOCKPORT_CORE_PIPELINE_H
#define BLOCKPORT_CORE_PIPELINE_H

#include "blockdev.h"

/* Run REQ, checked already by bd_submit() or bd_run(), in the calling
 * thread: the connection, serialisation, the operation, FUA emulated by
 * a flush.  Returns 0 or -errno. */
int bd_execute(struct bd *bd, struct bd_req *req);
/* The flush bd_close() owes a writable device: 0 or -errno. */
int bd_final_flush(struct bd *bd);
/* The connection of a request with conn == NULL (in blockdev.c, with the
 * other connections), opened on first use; NULL when the source refuses. */
struct bd_conn *bd_conn_default(struct bd *bd);

#endif
