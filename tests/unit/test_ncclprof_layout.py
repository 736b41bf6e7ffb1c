"""The plugin's C layouts against their mirrors: NCCL's ABI descriptors (harness ctypes vs
the sizes profiler/fs_nccl_abi.h pins) and the ring (C offsetof vs agent ctypes)."""

import ctypes
import re
import subprocess

import pytest

from fabricscope.agent.probes.ncclprof import layout
from tests.support.nccl_profiler_host import C_SIZES, PROFILER_DIR, mirror_sizes

PROBE = r"""
#include <stdio.h>
#include "fs_ncclprof.h"
#define F(t, m) printf("%s %zu %zu\n", #m, offsetof(struct t, m), sizeof(((struct t *)0)->m))
int main(void) {
  printf("SIZE %zu %zu\n", sizeof(struct fsp_ring_header), sizeof(struct fsp_record));
  %FIELDS%
  return 0;
}
"""


@pytest.fixture(scope="module")
def c_offsets(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("layout")
    fields = "\n".join(
        [f"F(fsp_record, {n});" for n, _ in layout.RawRecord._fields_] +
        [f"F(fsp_ring_header, {n});" for n, _ in layout.RingHeader._fields_
         if not n.startswith("_")])
    src = tmp / "probe.c"
    src.write_text(PROBE.replace("%FIELDS%", fields))
    subprocess.run(["gcc", f"-I{PROFILER_DIR}", str(src), "-o", str(tmp / "probe")], check=True)
    out = subprocess.run([str(tmp / "probe")], check=True, capture_output=True, text=True).stdout
    return out.splitlines()


def test_ring_header_and_record_sizes_agree_between_c_and_python(c_offsets):
    assert c_offsets[0] == f"SIZE {layout.HEADER_SIZE} {layout.RECORD_SIZE}"
    assert ctypes.sizeof(layout.RawRecord) == layout.RECORD_SIZE


def test_every_record_and_header_field_sits_at_the_c_offset(c_offsets):
    record = c_offsets[1:1 + len(layout.RawRecord._fields_)]
    for line, (name, _) in zip(record, layout.RawRecord._fields_, strict=True):
        c_name, offset, size = line.split()
        f = getattr(layout.RawRecord, name)
        assert (c_name, int(offset), int(size)) == (name, f.offset, f.size)
    for line in c_offsets[1 + len(layout.RawRecord._fields_):]:
        name, offset, size = line.split()
        f = getattr(layout.RingHeader, name)
        assert (int(offset), int(size)) == (f.offset, f.size), name


def test_nccl_descriptor_mirrors_have_nvidias_sizes():
    assert mirror_sizes() == C_SIZES
    pins = (PROFILER_DIR / "fs_nccl_abi.h").read_text()
    for v in range(1, 7):
        assert f"sizeof(fsp_descr_v{v}_t) == {C_SIZES[f'descr_v{v}']}" in pins


def _c_list(macro: str) -> tuple:
    text = (PROFILER_DIR / "fs_ncclprof.h").read_text()
    body = re.search(rf"#define {macro} (.*?)(?<!\\)\n", text, re.S).group(1)
    return tuple(x.strip() for x in re.findall(r'"([^"]+)"|(\d+)', body) for x in x if x)


@pytest.mark.parametrize("macro,table", [("FSP_FUNCS", layout.FUNCS), ("FSP_ALGOS", layout.ALGOS),
                                         ("FSP_PROTOS", layout.PROTOS),
                                         ("FSP_DTYPES", layout.DTYPES)])
def test_code_tables_agree_between_c_and_python(macro, table):
    assert _c_list(macro) == table


def test_datatype_sizes_agree_between_c_and_python():
    assert tuple(int(x) for x in _c_list("FSP_DTYPE_SIZES")) == layout.DTYPE_SIZES
