"""The seccomp filter every sandbox server installs on itself before it serves, so that everything
the sandbox runs inherits it. It refuses the kernel interfaces that no check or agent needs and that
either leak between sandboxes or are the kernel's usual attack surface:

- the kernel keyrings: a key added under a sandbox's uid outlives the sandbox and would be read by
  the next sandbox that leases the uid;
- io_uring, eBPF, perf events and userfaultfd: large interfaces behind many kernel exploits;
- namespaces and mounts (also impossible without capabilities: this is depth), ptrace and other
  processes' memory, and the host's administration (modules, kexec, clocks, swap, reboot);
- `ioctl(TIOCSTI)` / `TIOCLINUX`, which type into a terminal.

Refused calls fail with EPERM, as under Docker's default profile (on which, under Docker, this
filter stacks). `clone3` fails with ENOSYS instead: its flags cannot be inspected, and libc falls
back to `clone`, whose namespace flags are refused. A system call of another ABI (32-bit calls on
x86-64) kills the caller: libseccomp's default for a foreign architecture.

The filter is compiled here, with libseccomp, into BPF that the server loads with prctl(2).
"""

import base64
import errno
import tempfile
from functools import lru_cache

REFUSED = (
    # kernel keyrings
    "add_key",
    "keyctl",
    "request_key",
    # large kernel interfaces
    "bpf",
    "io_uring_enter",
    "io_uring_register",
    "io_uring_setup",
    "perf_event_open",
    "userfaultfd",
    # namespaces and mounts
    "chroot",
    "fsconfig",
    "fsmount",
    "fsopen",
    "fspick",
    "mount",
    "mount_setattr",
    "move_mount",
    "open_tree",
    "pivot_root",
    "setns",
    "umount2",
    "unshare",
    # other processes
    "process_vm_readv",
    "process_vm_writev",
    "ptrace",
    # the host's administration
    "acct",
    "adjtimex",
    "clock_adjtime",
    "clock_settime",
    "delete_module",
    "fanotify_init",
    "finit_module",
    "init_module",
    "kexec_file_load",
    "kexec_load",
    "lookup_dcookie",
    "name_to_handle_at",
    "open_by_handle_at",
    "quotactl",
    "reboot",
    "settimeofday",
    "swapoff",
    "swapon",
    "syslog",
    "uselib",
    "vhangup",
)
NAMESPACE_FLAGS = {
    "CLONE_NEWTIME": 0x00000080,
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}
TERMINAL_IOCTLS = {"TIOCSTI": 0x5412, "TIOCLINUX": 0x541C}


class SeccompUnavailableError(RuntimeError):
    """libseccomp is not on this host: the message says how to install it or go without."""


@lru_cache(maxsize=1)
def seccomp_program() -> str:
    """The filter as BPF, base64-encoded for the server's command line (compiled once per process)."""
    try:
        import pyseccomp as seccomp
    except (ImportError, RuntimeError) as exc:  # RuntimeError: the binding found no libseccomp
        raise SeccompUnavailableError(
            f"cannot build the sandbox's seccomp filter ({exc}): install libseccomp2 "
            "(`apt-get install libseccomp2`), or set FLYWHEEL_SANDBOX_SECCOMP=off to go without"
        ) from None
    refuse = seccomp.ERRNO(errno.EPERM)
    program = seccomp.SyscallFilter(seccomp.ALLOW)
    for name in REFUSED:
        program.add_rule(refuse, name)
    program.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    for flag in NAMESPACE_FLAGS.values():  # clone's first argument is its flags on every ABI but s390
        program.add_rule(refuse, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
    for request in TERMINAL_IOCTLS.values():
        program.add_rule(refuse, "ioctl", seccomp.Arg(1, seccomp.MASKED_EQ, 0xFFFFFFFF, request))
    with tempfile.TemporaryFile() as compiled:
        program.export_bpf(compiled)
        compiled.seek(0)
        return base64.b64encode(compiled.read()).decode()
