/* SPDX-License-Identifier: BSD-3-Clause */
/* librados and librbd, loaded on first use.
 *
 * Linking them would load both (tens of MiB of C++ with heavy static
 * constructors) into every blockport process, doubling the start-up time
 * of every command for users who never name an rbd: image.  The RBD files
 * include this header instead of calling the libraries directly: each
 * function they use is a pointer filled by rbd_lib_load() with dlsym(),
 * and the macros below send the usual names there. */
#pragma once

#include <rados/librados.h>
#include <rbd/librbd.h>

/* Every library function the RBD files call. */
#define RBD_LIB_FUNCS(X)                                                       \
  X(rados_cluster_fsid)                                                        \
  X(rados_conf_parse_env)                                                      \
  X(rados_conf_read_file)                                                      \
  X(rados_conf_set)                                                            \
  X(rados_connect)                                                             \
  X(rados_create)                                                              \
  X(rados_ioctx_create)                                                        \
  X(rados_ioctx_destroy)                                                       \
  X(rados_ioctx_set_namespace)                                                 \
  X(rados_shutdown)                                                            \
  X(rbd_aio_create_completion)                                                 \
  X(rbd_aio_discard)                                                           \
  X(rbd_aio_flush)                                                             \
  X(rbd_aio_get_arg)                                                           \
  X(rbd_aio_get_return_value)                                                  \
  X(rbd_aio_read)                                                              \
  X(rbd_aio_release)                                                           \
  X(rbd_aio_write)                                                             \
  X(rbd_aio_write_zeroes)                                                      \
  X(rbd_close)                                                                 \
  X(rbd_create4)                                                               \
  X(rbd_diff_iterate2)                                                         \
  X(rbd_get_features)                                                          \
  X(rbd_get_flags)                                                             \
  X(rbd_get_size)                                                              \
  X(rbd_image_options_create)                                                  \
  X(rbd_image_options_destroy)                                                 \
  X(rbd_image_options_set_uint64)                                              \
  X(rbd_lock_acquire)                                                          \
  X(rbd_lock_get_owners)                                                       \
  X(rbd_lock_get_owners_cleanup)                                               \
  X(rbd_open)                                                                  \
  X(rbd_open_read_only)                                                        \
  X(rbd_poll_io_events)                                                        \
  X(rbd_resize)                                                                \
  X(rbd_set_image_notification)                                                \
  X(rbd_snap_get_timestamp)                                                    \
  X(rbd_snap_list)                                                             \
  X(rbd_snap_list_end)                                                         \
  X(rbd_stat)

struct rbd_lib {
#define RBD_LIB_POINTER(f) __typeof__(f) *f;
  RBD_LIB_FUNCS(RBD_LIB_POINTER)
#undef RBD_LIB_POINTER
};
extern struct rbd_lib rbd_lib;

/* Loads librbd.so.1 and librados.so.2 once.  Returns 0, or -ENOTSUP with
 * a message in bd_errmsg() naming what to install. */
int rbd_lib_load(void);

#ifndef RBD_LIB_DEFINE
#define rados_cluster_fsid (rbd_lib.rados_cluster_fsid)
#define rados_conf_parse_env (rbd_lib.rados_conf_parse_env)
#define rados_conf_read_file (rbd_lib.rados_conf_read_file)
#define rados_conf_set (rbd_lib.rados_conf_set)
#define rados_connect (rbd_lib.rados_connect)
#define rados_create (rbd_lib.rados_create)
#define rados_ioctx_create (rbd_lib.rados_ioctx_create)
#define rados_ioctx_destroy (rbd_lib.rados_ioctx_destroy)
#define rados_ioctx_set_namespace (rbd_lib.rados_ioctx_set_namespace)
#define rados_shutdown (rbd_lib.rados_shutdown)
#define rbd_aio_create_completion (rbd_lib.rbd_aio_create_completion)
#define rbd_aio_discard (rbd_lib.rbd_aio_discard)
#define rbd_aio_flush (rbd_lib.rbd_aio_flush)
#define rbd_aio_get_arg (rbd_lib.rbd_aio_get_arg)
#define rbd_aio_get_return_value (rbd_lib.rbd_aio_get_return_value)
#define rbd_aio_read (rbd_lib.rbd_aio_read)
#define rbd_aio_release (rbd_lib.rbd_aio_release)
#define rbd_aio_write (rbd_lib.rbd_aio_write)
#define rbd_aio_write_zeroes (rbd_lib.rbd_aio_write_zeroes)
#define rbd_close (rbd_lib.rbd_close)
#define rbd_create4 (rbd_lib.rbd_create4)
#define rbd_diff_iterate2 (rbd_lib.rbd_diff_iterate2)
#define rbd_get_features (rbd_lib.rbd_get_features)
#define rbd_get_flags (rbd_lib.rbd_get_flags)
#define rbd_get_size (rbd_lib.rbd_get_size)
#define rbd_image_options_create (rbd_lib.rbd_image_options_create)
#define rbd_image_options_destroy (rbd_lib.rbd_image_options_destroy)
#define rbd_image_options_set_uint64 (rbd_lib.rbd_image_options_set_uint64)
#define rbd_lock_acquire (rbd_lib.rbd_lock_acquire)
#define rbd_lock_get_owners (rbd_lib.rbd_lock_get_owners)
#define rbd_lock_get_owners_cleanup (rbd_lib.rbd_lock_get_owners_cleanup)
#define rbd_open (rbd_lib.rbd_open)
#define rbd_open_read_only (rbd_lib.rbd_open_read_only)
#define rbd_poll_io_events (rbd_lib.rbd_poll_io_events)
#define rbd_resize (rbd_lib.rbd_resize)
#define rbd_set_image_notification (rbd_lib.rbd_set_image_notification)
#define rbd_snap_get_timestamp (rbd_lib.rbd_snap_get_timestamp)
#define rbd_snap_list (rbd_lib.rbd_snap_list)
#define rbd_snap_list_end (rbd_lib.rbd_snap_list_end)
#define rbd_stat (rbd_lib.rbd_stat)
#endif
