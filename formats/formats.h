/* Constructors of the sources blockport can open.  Each returns a struct bd
 * (see core/blockdev.h) or NULL with a message set by bd_set_error(). */
#ifndef BLOCKPORT_FORMATS_H
#define BLOCKPORT_FORMATS_H

#include <stdbool.h>
#include <stdint.h>

struct bd;

struct bd *raw_open(const char *path, bool readonly);
struct bd *null_open(const char *size);
struct bd *memory_open(const char *size);
/* nbd://, nbd+unix://, nbds:// and nbds+unix:// URIs, through libnbd. */
bool nbd_is_uri(const char *spec);
struct bd *nbd_source_open(const char *uri, bool readonly);
/* Options of each NBD source opened from now on.  Connections: 0 means 4
 * when the server advertises multi-conn, otherwise 1.  Timeout: seconds a
 * request may wait for a lost server (reconnecting) before failing with
 * EIO; 0 waits forever. */
extern unsigned nbd_source_connections;
extern unsigned nbd_source_timeout;
struct bd *qcow2_open(const char *path, bool readonly);
/* L2 cache of each qcow2 image opened from now on, in bytes. */
extern uint64_t qcow2_l2_cache_bytes;

#endif
