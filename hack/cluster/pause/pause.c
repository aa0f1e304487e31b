/*
 * pause: the process that holds a Kubernetes pod's namespaces open.
 *
 * Every pod sandbox runs one of these as its first process. It must stay alive (and idle)
 * until the runtime stops the pod, exit promptly on SIGINT/SIGTERM, and, as PID 1 of a pod
 * that shares its PID namespace, reap orphaned children so they do not linger as zombies.
 * Built static and shipped in an image FROM scratch (see hack/cluster/build.sh).
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_stop(int sig)
{
    (void)sig;
    _exit(0);
}

static void on_child(int sig)
{
    (void)sig;
    int saved = errno;  /* waitpid may clobber errno of the interrupted code */
    while (waitpid(-1, NULL, WNOHANG) > 0)
        ;
    errno = saved;
}

static int install(int sig, void (*fn)(int), int flags)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = fn;
    sa.sa_flags = flags;
    sigemptyset(&sa.sa_mask);
    return sigaction(sig, &sa, NULL);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "-v") == 0) {
        puts("torbed pause 1.0");
        return 0;
    }
    /* Only meaningful as PID 1; elsewhere it would hold nothing open. */
    if (getpid() != 1)
        fprintf(stderr, "pause: warning: not running as PID 1\n");

    if (install(SIGINT, on_stop, 0) < 0 || install(SIGTERM, on_stop, 0) < 0 ||
        install(SIGCHLD, on_child, SA_NOCLDSTOP | SA_RESTART) < 0) {
        perror("pause: sigaction");
        return 1;
    }
    for (;;)
        pause();
}
