/* The test bed's pod sandbox ("pause") process: holds the pod's namespaces open, reaps
 * orphaned children and exits cleanly on SIGINT/SIGTERM. Built statically with gcc into a
 * FROM-scratch image, because no registry (registry.k8s.io/pause) can be reached here. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }

static void reap(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction sa = {0};
    sa.sa_handler = stop;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sa.sa_handler = reap;
    sa.sa_flags = SA_NOCLDSTOP;
    sigaction(SIGCHLD, &sa, NULL);
    for (;;) pause();
    return EXIT_FAILURE;
}
