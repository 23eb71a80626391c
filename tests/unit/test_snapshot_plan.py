"""The snapshot agent's plan (stoker.snapshot.plan): which mounts a dump marks external and where a restore
finds them in another pod, which files it copies, CRIU's arguments, and where a snapshot may live. The mount
tables are shaped as the real node's containers have them (containerd, cgroup v1); the agent itself runs on
the real node in tests/e2e/test_snapshot_into_pod.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from stoker.snapshot import plan

HOST = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw
40 27 0:35 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory
41 27 0:36 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct
900 27 0:90 / /n/containerd/k8s.io/ab12/rootfs rw - overlay overlay rw,upperdir=/n/9/fs,workdir=/n/9/work
"""


def container(pod: str = "1234") -> str:
    return f"""\
800 700 0:90 / / rw,relatime - overlay overlay rw,upperdir=/n/9/fs,workdir=/n/9/work
801 800 0:91 / /proc rw,nosuid - proc proc rw
802 800 0:92 / /dev rw,nosuid - tmpfs tmpfs rw,size=65536k
803 802 0:93 / /dev/shm rw,nosuid - tmpfs shm rw,size=65536k
804 800 0:94 / /sys ro,nosuid - sysfs sysfs ro
805 804 0:35 /kubepods/pod{pod}/ab12 /sys/fs/cgroup/memory ro,nosuid - cgroup cgroup rw,memory
806 804 0:36 /kubepods/pod{pod}/ab12 /sys/fs/cgroup/cpu,cpuacct ro,nosuid - cgroup cgroup rw,cpu,cpuacct
807 800 254:0 /n/kubelet/pods/{pod}/etc-hosts /etc/hosts rw,relatime - ext4 /dev/vda rw
808 800 254:0 /n/kubelet/pods/{pod}/volumes/empty-dir/cache /cache rw,relatime - ext4 /dev/vda rw
809 800 254:0 /tmp/models\\040dir /models ro,relatime - ext4 /dev/vda rw
"""


def test_a_dump_carries_the_hosts_files_and_the_cgroups_and_leaves_the_rest_to_criu():
    mounts = plan.parse_mountinfo(container())
    assert plan.carried_mounts(mounts) == [
        "/sys/fs/cgroup/memory",
        "/sys/fs/cgroup/cpu,cpuacct",
        "/etc/hosts",
        "/cache",
        "/models",
    ]
    assert mounts[-1].root == "/tmp/models dir"  # mountinfo's octal escapes read back
    assert plan.upper_directory(mounts) == "/n/9/fs"


def test_a_restore_maps_each_carried_mount_to_what_the_target_has_there_on_the_host():
    source = plan.parse_mountinfo(container())
    target = plan.parse_mountinfo(container("5678"))
    carried = plan.carried_mounts(source)
    host = plan.parse_mountinfo(HOST)
    assert plan.mapped_mounts(carried, target, host) == [
        "/sys/fs/cgroup/memory/kubepods/pod5678/ab12",
        "/sys/fs/cgroup/cpu,cpuacct/kubepods/pod5678/ab12",
        "/n/kubelet/pods/5678/etc-hosts",
        "/n/kubelet/pods/5678/volumes/empty-dir/cache",
        "/tmp/models dir",
    ]
    # The target's root, as the host has it: the same overlay mounted at the runtime's rootfs.
    (root,) = [mount for mount in target if mount.mount_point == "/"]
    assert plan.host_path(root, host) == "/n/containerd/k8s.io/ab12/rootfs"


def test_a_target_without_a_carried_mount_or_a_host_without_its_filesystem_is_refused():
    carried = plan.carried_mounts(plan.parse_mountinfo(container()))
    bare = plan.parse_mountinfo(container().replace(" /models ", " /elsewhere "))
    with pytest.raises(LookupError, match="nothing mounted at /models"):
        plan.mapped_mounts(carried, bare, plan.parse_mountinfo(HOST))
    with pytest.raises(LookupError, match="no mount of 254:0"):
        plan.mapped_mounts(
            carried, plan.parse_mountinfo(container()), plan.parse_mountinfo(HOST.replace("254:0", "8:1"))
        )


def test_the_files_copied_are_the_engines_own_on_the_container_filesystems():
    mounts = plan.parse_mountinfo(container())
    held = [
        "/tmp/vllm.log",
        "/dev/shm/psm_1234",
        "/usr/lib/python3.11/lib-dynload/_ssl.so",  # the caller keeps it if the upper has it
        "/cache/torch_compile/abc.so",  # a volume: the target's own
        "/models/config.json",
        "pipe:[1234]",
        "socket:[99]",
        "anon_inode:[eventfd]",
        "/dev/null",
        "/dev/shm/sem.gone (deleted)",
        "/proc/1/status",
    ]
    assert plan.local_files(held, mounts, plan.carried_mounts(mounts)) == [
        ("/dev/shm/psm_1234", False),
        ("/tmp/vllm.log", True),
        ("/usr/lib/python3.11/lib-dynload/_ssl.so", True),
    ]


def test_link_remaps_are_looked_for_beside_the_deleted_files_the_engine_holds():
    held = [
        "/dev/shm/sem.aRdOB9 (deleted)",
        "/tmp/x/y.log (deleted)",
        "/dev/shm/psm_1234",  # not deleted
        "/memfd:cuda (deleted)",
        "/dev/nvidia0",
        "/tmp/../etc/z (deleted)",
        "/top-level (deleted)",
        "socket:[123]",
    ]
    assert plan.remap_directories(held) == ["/dev/shm", "/tmp/x"]


def test_criu_is_asked_for_the_external_namespaces_mounts_and_log_pipes_and_their_mapping():
    dump = plan.dump_arguments(
        "criu", 42, Path("/s/img"), {"pid": 7, "net": 9}, ["/etc/hosts", "/cache"], "d.log", "/s/img/keep"
    )
    assert dump == [
        "criu", "dump", "-t", "42", "-D", "/s/img", "--tcp-established", "--link-remap", "--leave-running",
        "--network-lock", "nftables", "--action-script", "/s/img/keep",
        "--external", "net[9]:netns", "--external", "pid[7]:pidns", "--external", "mnt[/etc/hosts]:m0",
        "--external", "mnt[/cache]:m1", "-o", "d.log",
    ]  # fmt: skip
    restore = plan.restore_arguments(
        "criu", 77, Path("/s/img"), {"pid": 5, "net": 6}, {"pipe:[31]": 8, "pipe:[30]": 7}, "/rootfs",
        ["/h/hosts", "/h/cache"], "/kubepods/x", "r.log",
    )  # fmt: skip
    assert restore == [
        "nsenter", "--target=77", "--pid", "--", "unshare", "--mount", "--mount-proc", "--",
        "criu", "restore", "-d", "-D", "/s/img", "--tcp-established", "--link-remap",
        "--inherit-fd", "fd[6]:netns", "--inherit-fd", "fd[5]:pidns",
        "--inherit-fd", "fd[7]:pipe:[30]", "--inherit-fd", "fd[8]:pipe:[31]", "--root", "/rootfs",
        "--external", "mnt[m0]:/h/hosts", "--external", "mnt[m1]:/h/cache", "--cgroup-root", "/kubepods/x",
        "-o", "r.log",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("namespace", "service", "key"),
    [
        ("..", "s", "ab12cd34"),
        ("team-a", "s/../../b", "ab12cd34"),
        ("team-a", "s", "../ab12"),
        ("A", "s", "ab12cd34"),
    ],
)
def test_a_snapshot_directory_is_its_namespace_service_and_key_and_never_outside_the_base(
    namespace, service, key
):
    assert plan.image_directory(Path("/var/lib/stoker"), "team-a", "s", "ab12cd34") == Path(
        "/var/lib/stoker/team-a/s/ab12cd34"
    )
    with pytest.raises(ValueError, match="not a valid name for a snapshot"):
        plan.image_directory(Path("/var/lib/stoker"), namespace, service, key)


def test_a_line_that_is_not_mountinfo_is_an_error():
    with pytest.raises(ValueError, match="not a mountinfo line"):
        plan.parse_mountinfo("36 35 98:0 /mnt1 /mnt2 rw")


def test_the_target_pid_counter_is_moved_past_the_trees_pids_before_criu_runs_in_that_namespace():
    assert plan.pid_counter_arguments(77, 412) == [
        "nsenter", "--target=77", "--pid", "--", "sh", "-c", "echo 412 > /proc/sys/kernel/ns_last_pid",
    ]  # fmt: skip
    # The source's counter, read in its namespace once the dump is over: above every PID in the image.
    assert plan.last_pid_arguments(42) == [
        "nsenter", "--target=42", "--pid", "--", "cat", "/proc/sys/kernel/ns_last_pid",
    ]  # fmt: skip


def handshake(name, namespace="team-a", key="ab12cd34", decision=None, offered=False, dump=None):
    return plan.PodHandshake(namespace, name, "llama", key, f"c-{name}", 4242, decision, offered, dump)


def kinds(actions):
    return [(action.kind, action.pod.name, action.reason) for action in actions]


def test_a_waiting_pod_is_restored_from_its_own_keys_snapshot_only_else_told_to_start():
    completed = {("team-a", "llama", "ab12cd34")}
    pods = [
        handshake("same-key"),
        handshake("other-key", key="ffff0000"),
        # Another namespace with the same service name and cache key: never team-a's snapshot.
        handshake("other-namespace", namespace="team-b"),
    ]
    assert kinds(plan.node_actions(pods, completed)) == [
        ("start", "other-key", plan.NO_SNAPSHOT),
        ("start", "other-namespace", plan.NO_SNAPSHOT),
        ("restore", "same-key", ""),
    ]


def test_one_offered_replica_per_key_is_dumped_the_rest_declined_at_once():
    pods = [
        handshake("b", decision="start", offered=True),
        handshake("a", decision="start", offered=True),
        handshake("has", key="ffff0000", decision="start", offered=True),
        handshake("over", decision="start", offered=True, dump="declined"),
        handshake("serving", decision="start"),  # started without an offer: nothing to do
        handshake("restored", decision="restore"),
    ]
    assert kinds(plan.node_actions(pods, {("team-a", "llama", "ffff0000")})) == [
        ("decline", "b", plan.DUMPING_ANOTHER),
        ("decline", "has", plan.HAVE_SNAPSHOT),
        ("dump", "a", ""),
    ]
