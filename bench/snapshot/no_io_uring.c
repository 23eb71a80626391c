/* no_io_uring CMD...: exec CMD under a seccomp filter that makes io_uring_setup(2) fail with ENOSYS, for CMD
 * and every child. CRIU cannot dump an io_uring instance, and vLLM's event loop (uvloop's libuv) always makes
 * one where the kernel allows it (UV_USE_IO_URING=0 turns off only its second ring); denied, libuv uses epoll.
 * In a pod the same is the runtime's default seccomp profile, which denies io_uring. x86_64 only. */
#include <errno.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

int main(int argc, char **argv) {
    struct sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (ENOSYS & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog program = {sizeof(filter) / sizeof(filter[0]), filter};
    if (argc < 2) {
        fprintf(stderr, "usage: %s CMD...\n", argv[0]);
        return 2;
    }
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program)) {
        perror("seccomp");
        return 1;
    }
    execvp(argv[1], argv + 1);
    perror("execvp");
    return 127;
}
