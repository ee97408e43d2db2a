"""The classification table: real kernel names of the stacks users run, and user extensions."""

from __future__ import annotations

from pathlib import Path

import pytest

from pcieprof.analysis.classify import Classifier
from pcieprof.errors import BadInput

# Names as they appear in real traces / source (see kernel_classes.toml for the sources).
REAL = [
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", "communication", "nccl"),
    ("ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)", "communication", "nccl"),
    ("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)", "communication", "nccl"),
    ("void sglang::cross_device_reduce_1stage<__half, 8>(sglang::RankData*, sglang::RankSignals, sglang::Signal*, __half*, int, int)", "communication", "custom_allreduce"),
    ("void vllm::cross_device_reduce_2stage<__nv_bfloat16, 8>(vllm::RankData*, vllm::RankSignals, vllm::Signal*, __nv_bfloat16*, int, int)", "communication", "custom_allreduce"),
    # SGLang's JIT custom all-reduce, as public SGLang torch-profiler kernel tables print it (the
    # project's code search: B200 serving runs, 2026); was read as compute
    ("void (anonymous namespace)::all_reduce_one_shot_push_kernel<__nv_bfloat16, 8u, true>((anonymous namespace)::AllReducePushData, device::distributed::PushController)", "communication", "sglang_custom_allreduce"),
    ("void (anonymous namespace)::all_reduce_two_shot_kernel<__nv_bfloat16, 4u, true>(host::distributed::AllReduceData const*, (anonymous namespace)::AllReduceParams, device::distributed::PullController)", "communication", "sglang_custom_allreduce"),
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<(unsigned long)4096>)", "communication", "nccl"),
    ("void flashinfer::trtllm_allreduce_fusion::allreduce_fusion_kernel_oneshot_lamport<(flashinfer::trtllm_allreduce_fusion::AllReduceFusionPattern)1, __nv_bfloat16, 8, true, true>(flashinfer::trtllm_allreduce_fusion::AllReduceFusionParams<__nv_bfloat16>)", "communication", "flashinfer_trtllm_allreduce"),
    ("void c10d::symmetric_memory::one_shot_all_reduce_kernel<c10::BFloat16, 16, 8>(c10::BFloat16**, unsigned long, unsigned long, unsigned int**, unsigned long, unsigned long)", "communication", "torch_symm_mem"),
    ("void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*, int*, long*, float*, int*, int*, int4 const*, float const*, long const*, float const*, bool const*, int const*, int, int)", "communication", "deepep"),
    ("void deep_ep::intranode::cached_notify_combine<8>(void**, int*, int, int, int, int**, int)", "communication", "deepep"),
    ("void sglang::allreduce_1shotLL_1node<__nv_bfloat16>(mscclpp::MemoryChannelDeviceHandle*, __nv_bfloat16*, __nv_bfloat16*, void*, int, int, unsigned long)", "communication", "mscclpp"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, at::detail::Array<char*, 1> >(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)", "compute", "compute"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas", "compute", "compute"),
]


@pytest.mark.parametrize("name, cls, family", REAL)
def test_real_kernel_names(name: str, cls: str, family: str) -> None:
    assert Classifier().gpu(name) == (cls, family)


def test_memory_by_category_and_gloo_on_cpu() -> None:
    c = Classifier()
    assert c.gpu("Memcpy DtoD (Device -> Device)", "gpu_memcpy")[0] == "memory"
    assert c.gpu("Memset (Device)", "gpu_memset")[0] == "memory"
    assert c.cpu("gloo:all_reduce") == ("communication", "gloo")
    assert c.cpu("gloo:broadcast")[0] == "communication"
    assert c.cpu("c10d::allreduce_")[0] == "ignore"
    assert c.cpu("aten::mm")[0] == "compute"
    # CPU-side annotations never classify GPU kernels
    assert c.gpu("gloo:all_reduce")[0] == "compute"


def test_user_table_goes_first(tmp_path: Path) -> None:
    t = tmp_path / "mine.toml"
    t.write_text('[[rule]]\npattern = "^my_fused_ar"\nclass = "communication"\nfamily = "mine"\n'
                 '[[rule]]\npattern = "ncclDevKernel_Broadcast"\nclass = "ignore"\n')
    c = Classifier(t)
    assert c.gpu("my_fused_ar_rmsnorm<8>") == ("communication", "mine")
    assert c.gpu("ncclDevKernel_Broadcast_RING_LL(...)")[0] == "ignore"
    assert c.gpu("ncclDevKernel_AllReduce_Sum_f32_RING_LL(...)")[0] == "communication"
    assert c.table()[0].origin == str(t)


@pytest.mark.parametrize("text, needle", [
    ('[[rule]]\npattern = "x"\nclass = "network"\n', "unknown class"),
    ('[[rule]]\npattern = "(["\nclass = "compute"\n', "not a regex"),
    ("[[rule]\n", "not a valid TOML"),
    ('title = "x"\n', "no [[rule]]"),
])
def test_bad_user_tables(tmp_path: Path, text: str, needle: str) -> None:
    t = tmp_path / "bad.toml"
    t.write_text(text)
    with pytest.raises(BadInput, match=needle.replace("[", r"\[")):
        Classifier(t)
