"""The memory a host store may take (the reference's, as the engine's
host_memory.cpp): a cgroup's limit, v2 or v1, on the process's cgroup or an
ancestor, where it is below the host's memory; read from a cgroup tree
written here. capacity_bytes past it is refused naming the file."""

from __future__ import annotations

import pytest
from activekv_reference.config import (
    ActiveKVConfig,
    ConfigError,
    HostMemory,
    cgroup_memory_limit,
    usable_host_memory,
)


@pytest.fixture
def tree(tmp_path):
    def write(relative: str, text: str) -> None:
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    def limit() -> HostMemory | None:
        return cgroup_memory_limit(str(tmp_path / "proc-cgroup"), str(tmp_path / "fs"))

    (tmp_path / "fs").mkdir()
    return write, limit, lambda relative: str(tmp_path / "fs" / relative)


def test_v2_the_smallest_limit_on_the_cgroup_and_its_ancestors_naming_its_file(tree):
    write, limit, file = tree
    write("proc-cgroup", "0::/system.slice/vllm.service\n")
    write("fs/memory.max", "max\n")
    write("fs/system.slice/memory.max", "8192\n")
    write("fs/system.slice/vllm.service/memory.max", "16384\n")  # its parent's cap still holds
    assert limit() == HostMemory(8192, "the memory limit of this process's cgroup, " + file("system.slice/memory.max"))


def test_v2_inside_a_container_the_namespaces_root_holds_the_limit(tree):
    write, limit, _ = tree
    write("proc-cgroup", "0::/\n")
    write("fs/memory.max", "1073741824\n")
    assert limit().bytes == 1073741824


def test_v2_max_everywhere_is_no_limit(tree):
    write, limit, _ = tree
    write("proc-cgroup", "0::/a\n")
    write("fs/memory.max", "max\n")
    write("fs/a/memory.max", "max\n")
    assert limit() is None


def test_v1_the_memory_controllers_limit_and_its_no_limit_number(tree):
    write, limit, file = tree
    write("proc-cgroup", "12:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n")
    write("fs/memory/memory.limit_in_bytes", "9223372036854771712\n")  # v1's "no limit"
    write("fs/memory/docker/abc/memory.limit_in_bytes", "2147483648\n")
    assert limit() == HostMemory(
        2147483648, "the memory limit of this process's cgroup, " + file("memory/docker/abc/memory.limit_in_bytes")
    )


def test_v1_a_containers_own_mount_without_the_hosts_path_is_found_above(tree):
    write, limit, _ = tree
    write("proc-cgroup", "4:memory:/docker/abc\n")  # the host's path; the container mounts its own cgroup
    write("fs/memory/memory.limit_in_bytes", "536870912\n")
    assert limit().bytes == 536870912


def test_nothing_readable_is_no_limit(tree):
    write, limit, _ = tree
    assert limit() is None  # no /proc file
    write("proc-cgroup", "garbage\n0::relative\n")
    assert limit() is None
    write("proc-cgroup", "0::/\n")
    write("fs/memory.max", "-1\n")
    assert limit() is None


def test_the_smaller_of_the_host_and_the_cgroup_limit():
    cgroup = HostMemory(4096, "the memory limit of this process's cgroup, X")
    assert usable_host_memory(8192, cgroup) == cgroup
    assert usable_host_memory(2048, cgroup) == HostMemory(2048, "this host's memory")
    assert usable_host_memory(2048, None) == HostMemory(2048, "this host's memory")
    assert usable_host_memory().bytes > 0


def test_a_capacity_past_the_cgroups_limit_is_refused_naming_its_file():
    config = ActiveKVConfig.from_extra_config({"capacity_bytes": 4097})
    limit = HostMemory(4096, "the memory limit of this process's cgroup, /sys/fs/cgroup/memory.max")
    with pytest.raises(ConfigError) as refused:
        config.store_slots(100, limit)
    assert str(refused.value) == (
        "kv_connector_extra_config['capacity_bytes']=4097 exceeds the memory limit of this process's cgroup, "
        "/sys/fs/cgroup/memory.max (4096 bytes); ask for less"
    )
    assert ActiveKVConfig.from_extra_config({"capacity_bytes": 4096}).store_slots(100, limit) == 40
