"""Importers: other tools' outputs -> pcieprof records -> a bundle (`pcieprof import`).

One module per format, each with a `looks_like` content test and a parser taking the text and the
file name (for messages) and returning typed records (`records.Parsed`) or, for NCCL logs and XML,
a documented JSON-able dict:

- `topo_p2p.parse_topo_p2p`          nvidia-smi topo -p2p r|w|rw|n|a|p
- `p2p_bandwidth_latency.parse_p2p_bandwidth_latency`   cuda-samples p2pBandwidthLatencyTest
- `simple_p2p.parse_simple_p2p`      cuda-samples simpleP2P (copy and verification)
- `nvbandwidth.parse_nvbandwidth_text`, `nvbandwidth.parse_nvbandwidth_json`
- `nccl_tests.parse_nccl_tests`      all_reduce_perf and the other *_perf collectives
- `nccl_log.parse_nccl_log`          NCCL_DEBUG=INFO logs -> NcclParsed (nccl_choices.json)
- `nccl_xml.parse_topo_xml`, `nccl_xml.parse_graph_xml`   NCCL_TOPO_FILE / NCCL_GRAPH_FILE
- machine logs (`nvidia-smi -q`, `lspci -vvv`, `nvidia-smi topo -m`, numactl, lscpu,
  /proc/cmdline, dmesg) go through the discovery parsers of `pcieprof.discover`.

`reading.read_input(path)` reads a file, pipe or device with bounds on bytes, time and line
length; `formats.FORMATS` lists every format once (name, content test, parser), in the order they are
tried; `formats.detect(text)` names the format from the content (bounded, linear) and
`formats.parse_text(text, name)` runs its parser; `bundle_writer.import_files(...)` writes
the bundle. A malformed or truncated input
raises `pcieprof.errors.BadInput` with one line naming the file, the line and what was expected.
"""

from pcieprof.importers.formats import FORMATS, detect

__all__ = ["FORMATS", "detect"]
