/* qcow2 consistency checks and refcount rebuilding (check.c). */
#ifndef BLOCKPORT_QCOW2_CHECK_H
#define BLOCKPORT_QCOW2_CHECK_H

#include <stdint.h>
#include <stdio.h>

struct qcow2dev;

struct qcow2_check_result {
  uint64_t corruptions; /* refcount below its references, bad references */
  uint64_t leaks;       /* refcount above its references */
  uint64_t allocated;   /* clusters in use */
  uint64_t clusters;    /* clusters in the file */
};

/* Count references and compare with the refcounts; lines about each
 * problem go to REPORT (may be NULL).  Returns 0 or -errno. */
int qcow2_check(struct qcow2dev *q, FILE *report,
                struct qcow2_check_result *res);
/* Replace the refcount structures with ones rebuilt from the references
 * (new blocks and table at the end of the file, then the header). */
int qcow2_rebuild_refcounts(struct qcow2dev *q);

enum qcow2_repair { QCOW2_REPAIR_NONE, QCOW2_REPAIR_LEAKS, QCOW2_REPAIR_ALL };

/* `blockport check`: open PATH, repair if asked, check.  SHARE (-U, no
 * repair only): check an image another process writes.  Returns 0, or
 * -errno with a message in bd_errmsg() when the check could not run. */
int qcow2_check_path(const char *path, enum qcow2_repair repair, bool share,
                     FILE *report, struct qcow2_check_result *res);

#endif
