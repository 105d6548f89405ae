/* SPDX-License-Identifier: BSD-3-Clause */
/* The FUSE request loop: N threads that receive requests from one session
 * (fuse_session_receive_buf) into buffers of their own pool and dispatch
 * them (fuse_session_process_buf).
 *
 * libfuse's fuse_session_loop_mt() reuses a thread's buffer for the next
 * request as soon as the handler returns, so a handler that answers later
 * must copy a write's data first.  Here a handler may keep the buffer the
 * request arrived in (fl_take_request_buf()) and the thread receives the
 * next request into a fresh one from the pool: a 1 MiB write is not copied
 * on its way to the device.  The same pool lends large buffers for reads.
 *
 * Stopping: libfuse's receive blocks in read(2) on /dev/fuse, which only a
 * signal interrupts; fl_stop() raises a flag and interrupts every thread
 * (repeatedly, in case one was about to block) until all have returned.
 * An unmount ends the loop by itself (read fails with ENODEV). */
#ifndef BLOCKPORT_FRONTEND_FUSE_LOOP_H
#define BLOCKPORT_FRONTEND_FUSE_LOOP_H

#include <stdbool.h>
#include <stddef.h>

struct fuse_session;
struct fuse_loop;

/* Bytes of a pool buffer: a request of 1 MiB of data plus its headers, with
 * room to spare (libfuse 3.14 reads at most 1 MiB + 4 KiB). */
#define FL_BUF_SIZE ((1u << 20) + (64u << 10))

struct fuse_loop *fl_new(struct fuse_session *se, unsigned threads,
                         unsigned cached_bufs);
/* Serve until fl_stop() or an unmount.  0, or -errno with bd_errmsg() set
 * when a thread failed. */
int fl_run(struct fuse_loop *l);
/* From any thread but a loop thread, at any time after fl_new(). */
void fl_stop(struct fuse_loop *l);
void fl_free(struct fuse_loop *l);

/* A buffer of FL_BUF_SIZE bytes (NULL when memory is short), and back. */
void *fl_buf_get(struct fuse_loop *l);
void fl_buf_put(struct fuse_loop *l, void *buf);

/* In a request handler on a loop thread: if DATA lies in the buffer the
 * request arrived in, take that buffer (give it back with fl_buf_put()
 * once done with DATA) and let the thread receive into another.  NULL when
 * that cannot be done (not a loop thread, no spare buffer): copy DATA. */
void *fl_take_request_buf(const void *data);

#endif
