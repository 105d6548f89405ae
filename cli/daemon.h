/* SPDX-License-Identifier: BSD-3-Clause */
/* Going into the background once ready (mount without -f, serve --fork). */
#ifndef BLOCKPORT_CLI_DAEMON_H
#define BLOCKPORT_CLI_DAEMON_H

/* Fork.  The parent waits for the child to say it is ready
 * (cli_daemon_ready()) and exits 0, or exits with the child's status when
 * it failed first.  Returns, in the child (a new session), the pipe to
 * give cli_daemon_ready().  Call it before any thread exists. */
int cli_daemonize(void);
/* Point stdin and stdout at /dev/null and stderr at LOG_FILE (or
 * /dev/null), so that whoever started us sees their pipes close. */
void cli_detach_stdio(const char *log_file);
/* Tell the waiting parent that we are ready, and close FD. */
void cli_daemon_ready(int fd);

#endif
