/* The pod sandbox's first process, for the cluster tier's own pause image (scripts/oci_image.py).
 *
 * A pod's containers join the namespaces this process holds, so it only has to stay alive until
 * the runtime stops it, and, as PID 1 of a pod that shares its process namespace, reap the
 * children it inherits. SIGINT and SIGTERM end it with status 0; nothing else does. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig)
{
	(void)sig;
	_exit(0);
}

static void reap(int sig)
{
	(void)sig;
	int saved = errno;
	while (waitpid(-1, NULL, WNOHANG) > 0)
		;
	errno = saved;
}

int main(int argc, char **argv)
{
	if (argc > 1 && strcmp(argv[1], "-v") == 0) {
		puts("mokkafs pause 1");
		return 0;
	}
	if (getpid() != 1)
		fputs("pause: not PID 1; children will not be reaped by this process\n", stderr);
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = stop;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	sa.sa_handler = reap;
	sa.sa_flags = SA_NOCLDSTOP;
	sigaction(SIGCHLD, &sa, NULL);
	for (;;)
		pause();
}
