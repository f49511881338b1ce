/* seccomp_exec: runs a command with io_uring refused, for test/fault_uring_refused_test.rb.
 *
 *   seccomp_exec COMMAND [ARGUMENT...]
 *
 * Installs a seccomp filter under which io_uring_setup(2) fails with EPERM, as it does in a
 * container whose seccomp profile leaves io_uring out (Docker's default since 25.0, for one), then
 * execs COMMAND, which inherits the filter. Every other system call is allowed.
 *
 * Exits 77 where it cannot do that (an architecture it does not know, no seccomp in the kernel),
 * 78 when the filter was installed but io_uring_setup still succeeds, 127 when COMMAND cannot run. */
#define _GNU_SOURCE
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>

#if defined(__x86_64__)
#define FILTER_ARCH AUDIT_ARCH_X86_64
#define X32_BIT 0x40000000u /* x32 calls come through the same architecture, with this bit set */
#elif defined(__aarch64__)
#define FILTER_ARCH AUDIT_ARCH_AARCH64
#define X32_BIT 0u
#endif

int
main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: seccomp_exec COMMAND [ARGUMENT...]\n");
        return 2;
    }
#if !defined(FILTER_ARCH) || !defined(__NR_io_uring_setup)
    fprintf(stderr, "seccomp_exec: no io_uring_setup filter for this architecture\n");
    return 77;
#else
    struct sock_filter filter[] = {
        /* A call from another architecture (ABI): not ours to judge. */
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, FILTER_ARCH, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 1, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup | X32_BIT, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog program = {.len = sizeof(filter) / sizeof(filter[0]), .filter = filter};
    /* Without privileges a filter needs no_new_privs; with them it does no harm. */
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) != 0) {
        fprintf(stderr, "seccomp_exec: cannot install the filter: %s\n", strerror(errno));
        return 77;
    }
    /* Check that it took: a valid request (one entry, no flags) must now be refused. */
    unsigned char params[120]; /* struct io_uring_params, zeroed */
    memset(params, 0, sizeof(params));
    long ring = syscall(__NR_io_uring_setup, 1, params);
    if (ring >= 0 || errno != EPERM) {
        fprintf(stderr, "seccomp_exec: io_uring_setup was not refused (%s)\n", ring >= 0 ? "it succeeded" : strerror(errno));
        if (ring >= 0) close((int)ring);
        return 78;
    }
    execvp(argv[1], argv + 1);
    fprintf(stderr, "seccomp_exec: %s: %s\n", argv[1], strerror(errno));
    return 127;
#endif
}
