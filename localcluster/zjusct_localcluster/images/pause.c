/* The sandbox ("pause") process of the test node's Pods: holds the Pod's namespaces, reaps orphaned
 * children (it is PID 1 of the Pod's PID namespace when that is shared), exits 0 on SIGINT/SIGTERM.
 * Built statically by tests/cluster (gcc -static -Os -s), never committed as a binary. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_term(int sig) { (void)sig; _exit(0); }

static void on_chld(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction term = {.sa_handler = on_term};
    struct sigaction chld = {.sa_handler = on_chld, .sa_flags = SA_NOCLDSTOP};
    if (sigaction(SIGINT, &term, NULL) < 0 || sigaction(SIGTERM, &term, NULL) < 0 ||
        sigaction(SIGCHLD, &chld, NULL) < 0) {
        return 1;
    }
    for (;;) {
        pause();
    }
}
