/*
 * nsexec: run a command inside other processes' namespaces, the helper chaos-daemon's process
 * manager (pkg/bpm of Chaos Mesh) starts its stressors through:
 *
 *   /usr/local/bin/nsexec [-c|-i|-n|-p|-m PATH]... [--] CMD [ARG...]
 *
 * Each option names a namespace file (/proc/<pid>/ns/<type>) to enter (cgroup, ipc, net, pid,
 * mount), entered in that order. CMD runs as a child (a PID namespace applies to children
 * only); SIGTERM and SIGINT are passed on to it as SIGTERM (chaos-daemon stops a stressor by
 * sending SIGTERM to this process and waiting for it to exit); the exit status is the
 * child's (128 + N when signal N ended it).
 *
 * Chaos Mesh's own nsexec is a Rust program in a repository of its own, which no package
 * registry reachable here carries: this one is written for torbed to the same command line.
 * Its -l (a mount namespace entered through an LD_PRELOAD library) is not supported: no
 * chaos kind torbed uses needs it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile pid_t child;

static void forward(int sig)
{
    (void)sig;
    if (child > 0)
        kill(child, SIGTERM);
}

static int enter(const char *path, int type)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || setns(fd, type) != 0) {
        fprintf(stderr, "nsexec: cannot enter %s: %s\n", path, strerror(errno));
        return -1;
    }
    close(fd);
    return 0;
}

int main(int argc, char *argv[])
{
    static const char opts[] = "cinpm";
    static const int types[] = {CLONE_NEWCGROUP, CLONE_NEWIPC, CLONE_NEWNET, CLONE_NEWPID, CLONE_NEWNS};
    const char *paths[5] = {0};
    int i = 1;

    for (; i < argc && argv[i][0] == '-'; i++) {
        const char *o = strchr(opts, argv[i][1]);
        if (strcmp(argv[i], "--") == 0) {
            i++;
            break;
        }
        if (argv[i][1] == '\0' || argv[i][2] != '\0' || o == NULL || i + 1 >= argc) {
            fprintf(stderr, "nsexec: unsupported option %s (usage: nsexec [-c|-i|-n|-p|-m PATH]... [--] CMD [ARG...])\n", argv[i]);
            return 2;
        }
        paths[o - opts] = argv[++i];
    }
    if (i >= argc) {
        fprintf(stderr, "nsexec: no command\n");
        return 2;
    }
    for (int k = 0; k < 5; k++)
        if (paths[k] && enter(paths[k], types[k]) != 0)
            return 1;

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = forward;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);

    child = fork();
    if (child < 0) {
        perror("nsexec: fork");
        return 1;
    }
    if (child == 0) {
        /* The command must not outlive this process, whoever ends it. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        execvp(argv[i], &argv[i]);
        fprintf(stderr, "nsexec: %s: %s\n", argv[i], strerror(errno));
        _exit(127);
    }
    int status;
    while (waitpid(child, &status, 0) < 0)
        if (errno != EINTR) {
            perror("nsexec: waitpid");
            return 1;
        }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
