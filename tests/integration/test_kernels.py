"""Kernel classification by name: real kernel names from public traces and profiles (the shared
traces, TensorBoard/HTA samples, nsys tables and issues quoting them), each with its class."""

from __future__ import annotations

import functools
import gzip
import json
from collections import Counter
from pathlib import Path

import pytest
from conftest import shared_trace

from trainadvisor.analyze.trace.kernels import classify

TC, FP32, UNKNOWN = "tensor_core", "fp32", "unknown"

NAMES = [
    # Volta (V100): fp32 SGEMM and cuDNN single-precision engines; fp16 HMMA (884)
    ("volta_sgemm_128x64_nn", "gemm", FP32),
    ("volta_h884gemm_64x64_ldg8_nn", "gemm", TC),
    ("volta_scudnn_128x64_relu_interior_nn_v1", "conv", FP32),
    ("volta_scudnn_winograd_128x128_ldg1_ldg4_relu_tile148t_nt_v1", "conv", FP32),
    (
        "void implicit_convolve_sgemm<float, float, 1024, 6, 7, 3, 3, 5, 1, false, true, true>(int, int, "
        "int, float const*, int, float*, float const*, kernel_conv_params, unsigned long long, int, float, "
        "float, int, float const*, float const*, bool, int, int)",
        "conv",
        FP32,
    ),
    (
        "void cudnn::detail::dgrad_engine<float, 512, 6, 5, 3, 3, 3, false>(int, int, int, float const*, "
        "int, float const*, int, float*, kernel_grad_params, unsigned long long, int, unsigned long long, "
        "int, float, int, int, int)",
        "conv",
        FP32,
    ),
    (
        "void cudnn::cnn::wgrad_alg0_engine<float, 128, 6, 7, 3, 3, 5, false, 512>(int, int, int, float "
        "const*, int, float*, float const*, kernel_grad_params, unsigned long long, int, float, int, int, "
        "int, int)",
        "conv",
        FP32,
    ),
    (  # batch norm is not convolution, though it is cuDNN's
        "void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, 512, true, 1>(cudnnTensorStruct, float const*, "
        "cudnnTensorStruct, float*, float const*, float const*, float, float, float*, float*, float*, "
        "float*, float, float)",
        "other",
        FP32,
    ),
    # Turing (T4, RTX 20xx): fp16 Tensor Core GEMMs
    ("turing_fp16_s1688gemm_fp16_128x64_sliced1x2_ldg8_f2f_tn", "gemm", TC),
    # Ampere (A100): plain fp32 GEMMs on the FP32 units (FFMA), whatever the library
    ("ampere_sgemm_128x64_nn", "gemm", FP32),
    (
        "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_aligna4_alignc4_"
        "execute_kernel__5x_cublas",
        "gemm",
        FP32,
    ),
    (
        "void cutlass::Kernel<cutlass_80_simt_sgemm_128x32_8x5_nn_align1>(cutlass_80_simt_sgemm_128x32_8x5_"
        "nn_align1::Params)",
        "gemm",
        FP32,
    ),
    # Ampere TF32 (Tensor Cores with fp32 storage)
    (
        "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x128_16x4_nn_align4>(cutlass_80_tensorop_"
        "s1688gemm_128x128_16x4_nn_align4::Params)",
        "gemm",
        TC,
    ),
    (
        "sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize64x128x32_stage5_warpsize2x2x1"
        "_g1_tensor16x8x8_execute_kernel_cudnn_infer",
        "conv",
        TC,
    ),
    (
        "sm80_xmma_wgrad_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x128x16_stage4_"
        "warpsize2x2x1_g1_tensor16x8x8_execute_kernel_cudnn_train",
        "conv",
        TC,
    ),
    (
        "void cutlass_cudnn_infer::Kernel<cutlass_tensorop_s1688dgrad_optimized_tf32_128x128_16x4_nhwc_unity_"
        "stride_align4>(cutlass_tensorop_s1688dgrad_optimized_tf32_128x128_16x4_nhwc_unity_stride_align4::"
        "Params)",
        "conv",
        TC,
    ),
    # Ampere bf16 / fp16
    (
        "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x6_tn_align8>("
        "cutlass_80_"
        "tensorop_bf16_s16816gemm_relu_bf16_64x64_64x6_tn_align8::Params)",
        "gemm",
        TC,
    ),
    (
        "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align2>(cutlass_"
        "80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align2::Params)",
        "gemm",
        TC,
    ),
    (
        "void cutlass__5x_cudnn::Kernel<cutlass_tensorop_bf16_s16816fprop_optimized_bf16_256x64_32x4_nhwc_"
        "align8>(cutlass_tensorop_bf16_s16816fprop_optimized_bf16_256x64_32x4_nhwc_align8::Params)",
        "conv",
        TC,
    ),
    # Hopper (H100): wgmma xmma, cuBLASLt nvjet, CUTLASS 3
    (
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_"
        "off_kernel__5x_cublas",
        "gemm",
        TC,
    ),
    ("nvjet_tst_128x96_64x7_4x1_v_bz_bias_TNT", "gemm", TC),
    ("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NNN", "gemm", TC),
    (
        "cutlass3x_sm90_tensorop_s64x128x16gemm_bf16_bf16_f32_bf16_bf16_128x128x64_2x1x1_0_ntn_align8_"
        "warpspecialized_pingpong_epi_tma",
        "gemm",
        TC,
    ),
    # Blackwell (B300)
    ("nvjet_sm103_tst_384x16_64x4_4x1_v_bz_TNT", "gemm", TC),
    # Fused attention: never a convolution (cuDNN SDPA says fprop), bf16/fp16 on Tensor Cores
    ("fmha_cutlassF_bf16_aligned_64x128_rf_sm80", "attention", TC),
    ("fmha_cutlassB_bf16_aligned_128x128_k128_sm80", "attention", TC),
    ("fmha_cutlassF_f32_aligned_64x64_rf_sm80", "attention", FP32),
    (
        "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_kernel0_0",
        "attention",
        TC,
    ),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x128_1x", "attention", TC),
    (
        "void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, "
        "cutlass::bfloat16_t, Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> >, false, true, "
        "false, false, true, true, false>(flash::Flash_fwd_params)",
        "attention",
        TC,
    ),
    (
        "fmhaSm100fKernel_QkvBfloat16OBfloat16H128PagedKvCausalP64MultiCtasKvCgaVarSeqQ8Kv128StaticSwapsAbForGen",
        "attention",
        TC,
    ),
    ("attn_fwd", "attention", UNKNOWN),  # AMD Triton attention: no dtype in the name
    ("kernel_unified_attention_2d", "attention", UNKNOWN),  # vLLM's Triton attention
    # AMD: hipBLASLt/Tensile GEMMs with MFMA tiles (MI...), MIOpen and Composable Kernel convolutions
    (
        "Cijk_Ailk_Bljk_BBS_BH_MT128x64x64_MI32x32x8x1_SN_1LDSB0_APM1_AF0EM1_AF1EM1_AMAS3_ASE_ASGT_ASLT_ASM_"
        "ASAE01_ASCE01_ASEM1_BL1_BS1_CLR1_DTVA0_DTVB0_ETSP_EPS1_ELFLR0_EMLL0_FSSC10_FL0_GLVWA2_GLVWB2",
        "gemm",
        TC,
    ),
    (
        "Cijk_Ailk_Bjlk_SB_Bias_AS_SAV_UserArgs_MT64x16x16_MI16x16x1_SN_LDSB0_AFC1_AFEM1_AFEM1_ASEM1_CLR1_CADS0",
        "gemm",
        TC,
    ),
    (
        "igemm_fwd_gtcx2_nhwc_bf16_bx0_ex1_bt64x64x64_wt16x16x16_ws1x1_wr2x2_ta1x8x2x1_1x8x1x32_tb1x8x2x1_"
        "1x8x1x32",
        "conv",
        TC,
    ),
    (
        "_ZN2ck16tensor_operation6device12_GLOBAL__N_139kernel_grouped_conv_fwd_xdl_cshuffle_v3INS_34Gridwise"
        "GemmMultiD_xdl_cshuffle_v3INS_13tensor_layout4gemm8RowMajorENS6_11ColumnMajorENS_5TupleIJEEES7_DF16b",
        "conv",
        TC,
    ),
    (  # bf16 stored as `unsigned short`: the name does not say, so nothing is claimed
        "void ck::kernel_moe_gemm<ck::GridwiseMoeGemm<ck::tensor_layout::gemm::RowMajor, ck::tensor_layout::"
        "gemm::ColumnMajor, ck::Tuple<ck::tensor_layout::gemm::RowMajor>, ck::tensor_layout::gemm::RowMajor, "
        "unsigned short, unsigned short, float, float, ck::Tuple<float, float, float>, unsigned short>",
        "gemm",
        UNKNOWN,
    ),
    # Not matrix work although the names say cudnn, cutlass, gemm or addmm
    (
        "void cudnn::engines_precompiled::nchwToNhwcKernel<__nv_bfloat16, __nv_bfloat16, float, false, true, "
        "(cudnnKernelDataType_t)0>(cudnn::engines_precompiled::nchw2nhwc_params_t<float>, __nv_bfloat16 "
        "const*, __nv_bfloat16*)",
        "other",
        TC,
    ),
    ("cask_cudnn::computeWgradBOffsetsKernel(cask_cudnn::ComputeWgradBOffsetsParams)", "other", UNKNOWN),
    ("triton_poi_fused_addmm_gelu_view_24", "other", UNKNOWN),
    (
        "void fbgemm_gpu::_block_bucketize_sparse_features_cuda_kernel1<int, int>(int, int, int const*, int, "
        "int const*, int const*, int*)",
        "other",
        UNKNOWN,
    ),
    (
        "kernel_cutlass_kernel_flashinfernormkernelsrmsnormRMSNormKernel_object_at__tensorptrbf16gmemalign128",
        "other",
        TC,
    ),
]


# Names from the development traces under ../shared/traces (listed in more/SOURCE.md), copied exactly,
# each with the class reviewed by hand: Blackwell, Hopper, MI300X, MI210, MI250 and A100 libraries.
MORE_TRACE_NAMES = [
    # B300 (Blackwell, cc 10.3), from more/tracelens/agent_evals/semantic_purity_qwen3_30b_a3b/
    # B300/1782799835.6885648-TP-0-DECODE.trace.json.gz
    ("nvjet_sm103_tst_32x64_64x16_4x1_v_bz_splitK_TNN", "gemm", TC),
    ("nvjet_sm103_tst_64x16_64x16_4x1_v_bz_TNT", "gemm", TC),
    (  # TensorRT-LLM batched GEMM: its `_BN_` flag is no batch norm
        "bmm_Bfloat16_Bfloat16Bfloat16_Fp32_t128x8x128u2_s6_et128x8_m128x8x16_c1x1x1_16dp256b_rM_BN_transOut"
        "_schPd2x1x2x3_bN_ldgsts_ldgstsSf_rgTma_clmp_swiGlu_dynB_sm100f",
        "gemm",
        TC,
    ),
    (  # CuTe DSL RMSNorm: `cutlass` in the name, no GEMM
        "kernel_cutlass_kernel_flashinfernormkernelsfused_add_rmsnormFusedAddRMSNormKernel_object_at__tensor"
        "ptrbf16gmemalign128o204820481_tensorptrbf16gmemalign128o204820481_tensorptrbf16gmemalign_0",
        "other",
        TC,
    ),
    (  # cuBLASLt's split-K reduction after a GEMM
        "void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, __nv_bfloat16, false, "
        "float, __nv_bfloat16, __nv_bfloat16, true, false, false, false>(cublasLt::cublasSplitKParams<float>"
        ", float const*, __nv_bfloat16 const*, float*, __nv_bfloat16*, float const*, float const*, __nv_bflo"
        "at16 const*, float const*, __nv_bfloat16*, void*, long, float*, int*, float*, float*, float const*,"
        " float const*, float const*, float const*, float const*)",
        "other",
        TC,
    ),
    (
        "void moe::dev::finalize::finalizeKernel<moe::dev::finalize::KernelParams<cutlass::bfloat16_t, cutla"
        "ss::bfloat16_t, 4, true> >(moe::dev::finalize::KernelParams<cutlass::bfloat16_t, cutlass::bfloat16_"
        "t, 4, true>)",
        "other",
        TC,
    ),
    (
        "void moe::dev::routing::routingCustom::routingIndicesDynBlockKernel<moe::dev::routing::routingCusto"
        "m::KernelParams<__nv_bfloat16, __nv_bfloat16, 128, 8, moe::dev::routing::TopKExpertSelect<moe::dev:"
        ":routing::NoOpPreprocess, moe::dev::routing::SoftmaxPostprocess> > >(moe::dev::routing::routingCust"
        "om::KernelParams<__nv_bfloat16, __nv_bfloat16, 128, 8, moe::dev::routing::TopKExpertSelect<moe::dev"
        "::routing::NoOpPreprocess, moe::dev::routing::SoftmaxPostprocess> >)",
        "other",
        TC,
    ),
    # H100 (Hopper), from more/tracelens/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.hf_token_redacted.json.gz
    (  # the one fp32 GEMM of the Qwen trace
        "void cutlass::Kernel2<cutlass_80_simt_sgemm_128x32_8x5_nn_align1>(cutlass_80_simt_sgemm_128x32_8x5_"
        "nn_align1::Params)",
        "gemm",
        FP32,
    ),
    (
        "void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<64, 128, 128, 4, false,"
        " false, cutlass::bfloat16_t, pytorch_flash::Flash_kernel_traits<64, 128, 128, 4, cutlass::bfloat16_"
        "t> >, false, true, false, false, false, true, false>(pytorch_flash::Flash_fwd_params)",
        "attention",
        TC,
    ),
    # H100, from more/tracelens/h100/Falconsai_nsfw_image_detection__1016002.hf_token_redacted.json.gz
    (
        "void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_128x64_64x6_tn_align8>(cutlass_"
        "80_tensorop_bf16_s16816gemm_relu_bf16_128x64_64x6_tn_align8::Params)",
        "gemm",
        TC,
    ),
    (
        "void cudnn::engines_precompiled::nhwcToNchwKernel<__nv_bfloat16, __nv_bfloat16, float, true, false,"
        " (cudnnKernelDataType_t)0>(cudnn::engines_precompiled::nhwc2nchw_params_t<float>, __nv_bfloat16 con"
        "st*, __nv_bfloat16*)",
        "other",
        TC,
    ),
    # H100, from more/tracelens/h100/google_owlv2-large-patch14-ensemble__1016001.hf_token_redacted.json.gz
    (
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize256x128x64_warpgroupsize2x1x1_execute_segment_k_of"
        "f_kernel__5x_cublas",
        "gemm",
        TC,
    ),
    (
        "void cutlass::Kernel2<cutlass_75_tensorop_bf16_s1688gemm_bf16_128x128_nn_align1>(cutlass_75_tensoro"
        "p_bf16_s1688gemm_bf16_128x128_nn_align1::Params)",
        "gemm",
        TC,
    ),
    (
        "void cutlass::Kernel2<cutlass_75_wmma_tensorop_bf16_s161616gemm_bf16_32x32_32x1_nn_align1>(cutlass_"
        "75_wmma_tensorop_bf16_s161616gemm_bf16_32x32_32x1_nn_align1::Params)",
        "gemm",
        TC,
    ),
    (  # cuBLAS GEMV: bf16 operands, no Tensor Core tile
        "std::enable_if<!(false), void>::type internal::gemvx::kernel<int, int, __nv_bfloat16, __nv_bfloat16"
        ", __nv_bfloat16, float, false, true, true, false, 7, false, cublasGemvParamsEx<int, cublasGemvTenso"
        "rStridedBatched<__nv_bfloat16 const>, cublasGemvTensorStridedBatched<__nv_bfloat16 const>, cublasGe"
        "mvTensorStridedBatched<__nv_bfloat16>, float> >(cublasGemvParamsEx<int, cublasGemvTensorStridedBatc"
        "hed<__nv_bfloat16 const>, cublasGemvTensorStridedBatched<__nv_bfloat16 const>, cublasGemvTensorStri"
        "dedBatched<__nv_bfloat16>, float>)",
        "gemm",
        UNKNOWN,
    ),
    (
        "void gemv2T_kernel_val<int, int, __nv_bfloat16, __nv_bfloat16, __nv_bfloat16, float, 128, 16, 4, 4,"
        " false, false, cublasGemvParamsEx<int, cublasGemvTensorStridedBatched<__nv_bfloat16 const>, cublasG"
        "emvTensorStridedBatched<__nv_bfloat16 const>, cublasGemvTensorStridedBatched<__nv_bfloat16>, float>"
        " >(cublasGemvParamsEx<int, cublasGemvTensorStridedBatched<__nv_bfloat16 const>, cublasGemvTensorStr"
        "idedBatched<__nv_bfloat16 const>, cublasGemvTensorStridedBatched<__nv_bfloat16>, float>, float, flo"
        "at)",
        "gemm",
        UNKNOWN,
    ),
    (
        "void cublasLt::splitKreduce_kernel<32, 16, int, __nv_bfloat16, __nv_bfloat16, float, __nv_bfloat16,"
        " true, true, false>(cublasLt::cublasSplitKParams<float>, __nv_bfloat16 const*, __nv_bfloat16 const*"
        ", __nv_bfloat16*, float const*, float const*, __nv_bfloat16 const*, __nv_bfloat16 const*, __nv_bflo"
        "at16*, void*, long, float*, int*)",
        "other",
        TC,
    ),
    # MI300X decode, from more/tracelens/agent_evals/semantic_purity_qwen3_30b_a3b/
    # MI300/1782859605.7198358-TP-0-DECODE.trace.json.gz
    (
        "Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT128x16x128_MI16x16x1_SN_LDSB1_AFC1_AFEM1_AFEM1_ASEM1"
        "_CLR1_CADS0_DTLA0_DTLB0_DTVA0_DTVB0_EPS0_FDSI0_GRPM1_GRVWA8_GRVWB8_GSUAMBSK_GLS0_ISA942_IU1_K1_LDST"
        "I0_LBSPPA1024_LBSPPB256_LBSPPM0_LPA16_LPB16_LPM0_LRVW8_LWPMn1_MIAV0_MIWT4_1_MO40_NTn1_NTA0_NTB0_NTC"
        "0_NTD4_NTM0_NEPBS16_NLCA1_NLCB1_ONLL1_PGR2_PLR1_PKA1_SIA3_SS1_SPO0_SRVW0_SSO0_SVW4_SK0_SKFTR0_SKXCC"
        "M0_TLDS1_ULSGRO0_USL1_UIOFGRO0_USFGROn1_VSn1_VWA4_VWB1_WSGRA0_WSGRB0_WS64_WG32_4_2",
        "gemm",
        TC,
    ),
    (
        "void paged_attention_ll4mi_QKV_mfma16_kernel<0, __hip_bfloat16, __hip_bfloat16, (vllm::Fp8KVCacheDa"
        "taType)0, 1, 128, 256, false, 8, 1, ck_tile::ComposedAttention<0u, false> >(__hip_bfloat16 const*, "
        "__hip_bfloat16 const*, __hip_bfloat16 const*, float, int const*, int const*, int const*, float cons"
        "t*, int, int, int, int, float*, float*, __hip_bfloat16*, float, float, float const*, float const*, "
        "float const*, ck_tile::ComposedAttention<0u, false> const*)",
        "attention",
        TC,
    ),
    (  # merges the split-KV partials: no matrix work
        "void paged_attention_ll4mi_reduce_kernel<__hip_bfloat16, __hip_bfloat16, 128, 128, 256, 3, false>(_"
        "_hip_bfloat16*, float const*, float const*, __hip_bfloat16 const*, int const*, int const*, int, int"
        ", float const*)",
        "other",
        TC,
    ),
    (
        "_ZN5aiter24add_rmsnorm_quant_kernelIDF16bDF16bLi64ELi8ELb0ELb0ELb1ELi1EEEvPT0_PT_PfS4_S4_S4_diiiiii"
        "ib",
        "other",
        TC,
    ),
    ("aiter::topksoftmax_4x128x8_bf16", "other", TC),
    (
        "void ck_tile::kentry<2, ck_tile::MoeSortingKernel<ck_tile::MoeSortingProblemEx<int, float, 2, true,"
        " false, false, true, 0> >, ck_tile::MoeSortingKernel<ck_tile::MoeSortingProblemEx<int, float, 2, tr"
        "ue, false, false, true, 0> >::Kargs>(ck_tile::MoeSortingKernel<ck_tile::MoeSortingProblemEx<int, fl"
        "oat, 2, true, false, false, true, 0> >::Kargs)",
        "other",
        UNKNOWN,
    ),
    ("create_flashinfer_kv_indices_triton", "other", UNKNOWN),
    # MI300X, from more/tracelens/mi300/Qwen_Qwen1.5-0.5B-Chat__1016005.hf_token_redacted.json.gz:
    # hipBLASLt's `B_BS` (bf16) and `S_B` (fp32) types, both on MFMA tiles
    (
        "Cijk_Alik_Bljk_B_BS_BH_Bias_HA_S_SAV_UserArgs_MT256x128x64_MI16x16x1_SN_LDSB1_AFC1_AFEM1_AFEM1_ASEM"
        "1_CLR1_CADS0_DTVA0_DTVB0_EPS0_FDSI0_GRPM1_GRVWA8_GRVWB8_GSUAMB_GLS0_ISA942_IU1_K1_LBSPPA1024_LBSPPB"
        "512_LBSPPM0_LPA16_LPB16_LPM0_LRVW8_LWPMn1_MIAV0_MIWT8_4_MO40_NTn1_NTA0_NTB0_NTC0_NTD0_NTM0_NEPBS16_"
        "NLCA1_NLCB1_ONLL1_PGR2_PLR1_PKA1_SIA3_SS1_SPO0_SRVW0_SSO0_SVW8_SK0_SKXCCM0_TLDS1_ULSGRO0_USL1_UIOFG"
        "RO0_USFGROn1_VSn1_VWA8_VWB4_WSGRA0_WSGRB0_WS64_WG32_8_1",
        "gemm",
        TC,
    ),
    (
        "Cijk_Ailk_Bljk_S_B_Bias_HA_S_SAV_UserArgs_MT16x16x128_MI16x16x1_SN_LDSB1_AFC1_AFEM1_AFEM1_ASEM1_CLR"
        "1_CADS0_DTVA0_DTVB0_EPS0_FDSI0_GRPM1_GRVWA2_GRVWB2_GSUAMB_GLS0_ISA942_IU1_K1_LBSPPA256_LBSPPB512_LB"
        "SPPM0_LPA16_LPB8_LPM0_LRVW4_LWPMn1_MIAV0_MIWT1_1_MO40_NTn1_NTA4_NTB0_NTC0_NTD4_NTM0_NEPBS16_NLCA1_N"
        "LCB1_ONLL1_PGR2_PLR1_PKA1_SIA3_SS1_SPO0_SRVW0_SSO0_SVW1_SK0_SKXCCM0_TLDS1_ULSGRO0_USL1_UIOFGRO0_USF"
        "GROn1_VSn1_VWA1_VWB1_WSGRA0_WSGRB0_WS64_WG16_4_4",
        "gemm",
        TC,
    ),
    # MI300X vLLM: more/tracelens/inference/vllm_decode_full/graph_execution.json.gz
    (
        "Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT448x32x64_MI16x16x1_SN_LDSB1_AFC1_AFEM1_AFEM1_ASEM1_"
        "CLR1_CADS0_DTVA0_DTVB0_EPS0_FDSI0_GRPM1_GRVWA2_GRVWB2_GSUAMB_GLS0_ISA942_IU1_K1_LBSPPA128_LBSPPB256"
        "_LBSPPM0_LPA4_LPB4_LPM0_LRVW4_LWPMn1_MIAV0_MIWT7_2_MO40_NTn1_NTA4_NTB0_NTC0_NTD4_NTM0_NEPBS16_NLCA1"
        "_NLCB1_ONLL1_PGR2_PLR1_PKA1_SIA3_SS1_SPO0_SRVW0_SSO0_SVW1_SK0_SKXCCM0_TLDS1_ULSGRO0_USL1_UIOFGRO0_U"
        "SFGROn1_VSn1_VWA1_VWB2_WSGRA0_WSGRB0_WS64_WG64_4_1",
        "gemm",
        TC,
    ),
    ("_matmul_ogs_NNT_bf16xbf16xmxfp4_16x128x256x1_swiglu", "gemm", TC),
    (  # triton_kernels' MoE scatter-sum
        "_finalize_matmul_scatter_bf16",
        "other",
        TC,
    ),
    (
        "_ZN7ck_tile6kentryILi1ENS_12Rmsnorm2dFwdINS_27Rmsnorm2dFwdPipelineOnePassINS_27Rmsnorm2dFwdPipeline"
        "ProblemIDF16bDF16bfDF16bDF16bDF16bffNS_19Generic2dBlockShapeINS_8sequenceIJLi1ELi3072EEEENS5_IJLi1E"
        "Li128EEEENS5_IJLi1ELi8EEEEEENS_18Rmsnorm2dFwdTraitsILb1ELb0ELb0ELb0ELNS_21Rmsnorm2dFusedAddEnumE1EL"
        "NS_23Rmsnorm2dFusedQuantEnumE0ELNS_22Rmsnorm2dSensitiveEnumE0EEEEENS_33Rmsnorm2dFwdPipelineDefaultP"
        "olicyEEENS_17Default2DEpilogueINS_24Default2DEpilogueProblemIfDF16bLb0ELb1ELb0EEEvEEEEJNSM_5KargsEE"
        "EEvDpT1_",
        "other",
        TC,
    ),
    ("kernel_unified_attention_3d", "attention", UNKNOWN),
    ("reduce_segments", "other", UNKNOWN),
    ("triton_poi_fused_constant_pad_nd_moe_forward_0", "other", UNKNOWN),
    # MI300X xDiT Flux: more/tracelens/inference/xdit_flux.1_aiter_sage/profile_trace_rank_0.json.gz
    (
        "Cijk_Ailk_Bljk_BBS_BH_MT128x128x64_MI16x16x16x1_SN_1LDSB0_APM1_AF0EM1_AF1EM1_AMAS3_ASE_ASGT_ASLT_AS"
        "M_ASAE01_ASCE01_ASEM1_BL1_BS1_CLR1_DTVA1_DTVB0_ETSP_EPS1_ELFLR0_EMLL0_FSSC10_FL0_GLVWA2_GLVWB4_GRCG"
        "A1_GRCGB1_GRPM1_GRVWn1_GSU1_GSUASB_GLS0_ISA942_IU1_K1_KLA_LBSPPA0_LBSPPB1024_LPA0_LPB4_LRVW4_LWPMn1"
        "_MIAV0_MKFGSU256_NTA0_NTB0_NTC1_NTD1_NEPBS0_NLCA1_NLCB1_ONLL1_PK0_PGR2_PLR5_PKA0_SIA3_SLW1_SS1_SU0_"
        "SUM0_SUS0_SPO1_SRVW0_SSO0_SVW2_TSGRA0_TSGRB0_TT2_128_TLDS0_UMLDSA0_UMLDSB0_U64SL1_USFGROn1_VAW1_VSn"
        "1_VW2_VWB4_VFLRP1_WSGRA0_WSGRB0_WG64_4_1_WGMn2",
        "gemm",
        TC,
    ),
    (
        "igemm_fwd_gtcx3_nhwc_bf16_bx0_ex1_bt128x128x32_wt32x32x8_ws1x1_wr2x2_ta1x8x2x1_1x4x1x64_tb1x8x2x1_1"
        "x4x1x64_gkgs",
        "conv",
        TC,
    ),
    (  # aiter SageAttention: quantised, no type in the name
        "sage_fwd",
        "attention",
        UNKNOWN,
    ),
    ("sage_quant_kernel", "other", UNKNOWN),
    (  # MIOpen's copy: `TensorOp` is no CUTLASS tensorop
        "SubTensorOpWithCastTensor1d",
        "other",
        UNKNOWN,
    ),
    ("batched_transpose_32x32_half", "other", TC),
    ("Im2d2Col_v2", "other", UNKNOWN),
    ("triton_red_fused_add_addmm_mul_native_layer_norm_split_unsqueeze_view_5", "other", UNKNOWN),
    # MI210 training: more/tracelens/mi210/gpu_only_trace/gpu_only_trace.json.gz
    (
        "igemm_bwd_gtcx2_nhwc_bf16_bx0_ex1_bt128x128x32_wt32x32x8_ws1x1_wr2x2_ta1x8x2x1_1x4x1x64_tb1x8x1x2_1"
        "x4x1x64_mh_gkgs",
        "conv",
        TC,
    ),
    (
        "igemm_wrw_gtcx2_nhwc_bf16_bx0_ex1_bt128x128x16_wt32x32x8_ws1x1_wr2x2_ta1x4x1x2_1x4x1x64_tb1x4x1x2_1"
        "x4x1x64_gkgs",
        "conv",
        TC,
    ),
    (
        "Cijk_Ailk_Bjlk_BBS_BH_Bias_HAS_SAV_UserArgs_MT128x64x32_MI32x32x1_SN_LDSB0_AFC1_AFEM1_AFEM1_ASEM1_C"
        "LR1_CADS0_DTVA0_DTVB0_EPS0_FDSI0_GRPM1_GRVWA8_GRVWB8_GSUAMB_GLS0_ISA90a_IU1_K1_LBSPPA0_LBSPPB0_LBSP"
        "PM0_LPA0_LPB0_LPM0_LRVW4_LWPMn1_MIAV0_MIWT2_1_MO40_NTn1_NTA0_NTB0_NTC0_NTD0_NTM0_NEPBS2_NLCA1_NLCB1"
        "_ONLL1_PGR2_PLR1_PKA1_SIA3_SS1_SPO1_SRVW0_SSO0_SVW1_SK0_SKXCCM0_TLDS0_ULSGRO0_USL1_UIOFGRO0_USFGROn"
        "1_VSn1_VWA2_VWB1_WSGRA0_WSGRB0_WS64_WG64_4_1",
        "gemm",
        TC,
    ),
    (
        "void at::native::batch_norm_backward_kernel<c10::BFloat16, c10::BFloat16, float, int>(at::GenericPa"
        "ckedTensorAccessor<c10::BFloat16 const, 3ul, at::DefaultPtrTraits, int>, at::GenericPackedTensorAcc"
        "essor<c10::BFloat16 const, 3ul, at::DefaultPtrTraits, int>, at::GenericPackedTensorAccessor<c10::BF"
        "loat16, 3ul, at::DefaultPtrTraits, int>, at::GenericPackedTensorAccessor<c10::BFloat16, 1ul, at::De"
        "faultPtrTraits, int>, at::GenericPackedTensorAccessor<c10::BFloat16, 1ul, at::DefaultPtrTraits, int"
        ">, at::GenericPackedTensorAccessor<c10::BFloat16 const, 1ul, at::DefaultPtrTraits, int>, at::Generi"
        "cPackedTensorAccessor<c10::BFloat16 const, 1ul, at::DefaultPtrTraits, int>, at::GenericPackedTensor"
        "Accessor<c10::BFloat16 const, 1ul, at::DefaultPtrTraits, int>, at::GenericPackedTensorAccessor<floa"
        "t const, 1ul, at::DefaultPtrTraits, int>, at::GenericPackedTensorAccessor<float const, 1ul, at::Def"
        "aultPtrTraits, int>, bool, float)",
        "other",
        TC,
    ),
    (
        "void at::native::(anonymous namespace)::max_pool_backward_nchw<c10::BFloat16, float>(c10::BFloat16 "
        "const*, long const*, int, long, long, long, int, int, int, int, int, int, int, int, int, int, c10::"
        "BFloat16*)",
        "other",
        TC,
    ),
    # MI300X normalization: more/tracelens/perf_model/normalization/normalization_layer_test.json.gz
    ("MIOpenBatchNormBwdSpatial", "other", UNKNOWN),
    (
        "void at::native::batch_norm_backward_kernel<float, float, float, int>(torch::headeronly::detail::Ge"
        "nericPackedTensorAccessor<torch::headeronly::detail::TensorAccessor<c10::ArrayRef<long>, float cons"
        "t, 2ul, torch::headeronly::DefaultPtrTraits, int>, at::detail::IndexBoundsCheck<3ul, int>, float co"
        "nst, 3ul, torch::headeronly::DefaultPtrTraits, int>, torch::headeronly::detail::GenericPackedTensor"
        "Accessor<torch::headeronly::detail::TensorAccessor<c10::ArrayRef<long>, float const, 2ul, torch::he"
        "aderonly::DefaultPtrTraits, int>, at::detail::IndexBoundsCheck<3ul, int>, float const, 3ul, torch::"
        "headeronly::DefaultPtrTraits, int>, torch::headeronly::detail::GenericPackedTensorAccessor<torch::h"
        "eaderonly::detail::TensorAccessor<c10::ArrayRef<long>, float, 2ul, torch::headeronly::DefaultPtrTra"
        "its, int>, at::detail::IndexBoundsCheck<3ul, int>, float, 3ul, torch::headeronly::DefaultPtrTraits,"
        " int>, torch::headeronly::detail::GenericPackedTensorAccessor<torch::headeronly::detail::TensorAcce"
        "ssor<c10::ArrayRef<long>, float, 0ul, torch::headeronly::DefaultPtrTraits, int>, at::detail::IndexB"
        "oundsCheck<1ul, int>, float, 1ul, torch::headeronly::DefaultPtrTraits, int>, torch::headeronly::det"
        "ail::GenericPackedTensorAccessor<torch::headeronly::detail::TensorAccessor<c10::ArrayRef<long>, flo"
        "at, 0ul, torch::headeronly::DefaultPtrTraits, int>, at::detail::IndexBoundsCheck<1ul, int>, float, "
        "1ul, torch::headeronly::DefaultPtrTraits, int>, torch::headeronly::detail::GenericPackedTensorAcces"
        "sor<torch::headeronly::detail::TensorAccessor<c10::ArrayRef<long>, float const, 0ul, torch::headero"
        "nly::DefaultPtrTraits, int>, at::detail::IndexBoundsCheck<1ul, int>, float const, 1ul, torch::heade"
        "ronly::DefaultPtrTraits, int>, torch::headeronly::detail::GenericPackedTensorAccessor<torch::header"
        "only::detail::TensorAccessor<c10::ArrayRef<long>, float const, 0ul, torch::headeronly::DefaultPtrTr"
        "aits, int>, at::detail::IndexBoundsCheck<1ul, int>, float const, 1ul, torch::headeronly::DefaultPtr"
        "Traits, int>, torch::headeronly::detail::GenericPackedTensorAccessor<torch::headeronly::detail::Ten"
        "sorAccessor<c10::ArrayRef<long>, float const, 0ul, torch::headeronly::DefaultPtrTraits, int>, at::d"
        "etail::IndexBoundsCheck<1ul, int>, float const, 1ul, torch::headeronly::DefaultPtrTraits, int>, tor"
        "ch::headeronly::detail::GenericPackedTensorAccessor<torch::headeronly::detail::TensorAccessor<c10::"
        "ArrayRef<long>, float const, 0ul, torch::headeronly::DefaultPtrTraits, int>, at::detail::IndexBound"
        "sCheck<1ul, int>, float const, 1ul, torch::headeronly::DefaultPtrTraits, int>, torch::headeronly::d"
        "etail::GenericPackedTensorAccessor<torch::headeronly::detail::TensorAccessor<c10::ArrayRef<long>, f"
        "loat const, 0ul, torch::headeronly::DefaultPtrTraits, int>, at::detail::IndexBoundsCheck<1ul, int>,"
        " float const, 1ul, torch::headeronly::DefaultPtrTraits, int>, bool, float)",
        "other",
        FP32,
    ),
    # A100: more/hta_extra/critical_path/simple_add/benchmark_result_493459_1694039959_trace.json.gz and
    # more/switch_transformers/trace_100Kpar_4exp_8batch_128seq_1024.json.gz
    (
        "sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16_stage4_w"
        "arpsize2x2x1_g1_tensor16x8x8_alignc4_execute_kernel_cudnn",
        "conv",
        TC,
    ),
    ("ampere_sgemm_32x32_sliced1x4_tn", "gemm", FP32),
    ("cudnn_ampere_scudnn_128x64_relu_xregs_large_nn_v1", "conv", FP32),
    (  # complex GEMM of cuDNN's FFT convolution
        "ampere_gcgemm_64x64_nt",
        "gemm",
        FP32,
    ),
    (
        "void cask_cudnn::computeOffsetsKernel<false, false>(cask_cudnn::ComputeOffsetsParams)",
        "other",
        UNKNOWN,
    ),
    ("ampere_sgemm_128x128_nn", "gemm", FP32),
    ("ampere_sgemm_64x64_tn", "gemm", FP32),
    # MI250: hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz (an fp32 `SB` GEMM on MFMA tiles)
    (
        "Cijk_Alik_Bljk_SB_Bias_AS_SAV_UserArgs_MT64x16x32_MI16x16x1_SN_LDSB0_AFC1_AFEM1_AFEM1_ASEM1_CLR1_CA"
        "DS0_EPS0_GRVWA2_GRVWB2_GSUAMB_ISA90a_IU1_K1_LBSPPA128_LBSPPB128_LBSPPM0_LPA8_LPB8_LPM0_LRVW4_LWPMn1"
        "_MIAV0_MIWT1_1_MO40_NTn1_NTA0_NTB0_NTC0_NTD0_NTM0_NEPBS2_NLCA1_NLCB1_ONLL1_PGR2_PLR1_PKA1_SIA3_SS1_"
        "SPO1_SRVW0_SSO0_SVW1_TLDS1_USFGROn1_VSn1_VWA1_VWB1_WSGRA1_WSGRB1_WS64_WG64_4_1",
        "gemm",
        TC,
    ),
    # Tensile's type code without an MI tile: a vector (`_MAC_`) fp32 kernel, as rocBLAS runs them on a
    # gfx906 (MI50, no matrix cores); the name as quoted in public code
    (
        "Cijk_Ailk_Bljk_SB_MT256x32x8_SN_APM1_AF0EM1_AF1EM1_AMAS3_ASAE01_ASCE01_ASEM1_BL1_DTL0_ETSP_EPS1_FL0"
        "_GRVW4_GSU1_GSUAMB_ISA906_IU1_K1_KLA_LPA0_LPB0_LDL1_LRVW4_MAC_MDA2_NLCA1_NLCB1_ONLL1_PK0_PGR1_PLR1_R"
        "K0_SU32_SUM0_SUS256_SVW4_SNLL0_TT8_4_USFGROn1_VAW1_VSn1_VW4_WG32_8_1_WGM1",
        "gemm",
        FP32,
    ),
]

ALL_NAMES = NAMES + MORE_TRACE_NAMES


@pytest.mark.parametrize(("name", "kind", "precision"), ALL_NAMES, ids=[n[0][:60] for n in ALL_NAMES])
def test_kernel_class_from_its_name(name: str, kind: str, precision: str) -> None:
    found = classify(name)
    assert (found.kind, found.precision) == (kind, precision)


def test_what_counts_as_fp32_matrix_work() -> None:
    # fp32 FFMA GEMMs on an A100 are the work mixed precision and TF32 would speed up ...
    assert classify(NAMES[10][0]).fp32_matrix and "ffma" in NAMES[10][0]
    # ... bf16 GEMMs, nvjet and fused attention on an H100 are not; nor is an elementwise bf16
    # kernel Tensor Core work, nor is a GEMM whose name shows neither.
    for name in (
        NAMES[19][0],
        "nvjet_tst_128x96_64x7_4x1_v_bz_bias_TNT",
        "fmha_cutlassF_bf16_aligned_64x128_rf_sm80",
    ):
        assert classify(name).tensor_core and not classify(name).fp32_matrix
    assert not classify(NAMES[-5][0]).tensor_core
    assert not classify("attn_fwd").fp32_matrix and not classify(NAMES[-6][0]).fp32_matrix


@functools.cache
def _kernel_names(path: Path) -> frozenset[str]:
    """The distinct names of the GPU kernels a Kineto trace ran."""
    with gzip.open(path) as f:
        events = json.load(f)["traceEvents"]
    return frozenset(e["name"] for e in events if e.get("cat") == "kernel" and e.get("ph") == "X")


B300_DECODE = (
    "tracelens/agent_evals/semantic_purity_qwen3_30b_a3b/B300/1782799835.6885648-TP-0-DECODE.trace.json.gz"
)
MI300_DECODE = (
    "tracelens/agent_evals/semantic_purity_qwen3_30b_a3b/MI300/1782859605.7198358-TP-0-DECODE.trace.json.gz"
)
H100_QWEN = "tracelens/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.hf_token_redacted.json.gz"

# Distinct kernel names per (kind, precision), reviewed name by name. B300: 3 nvjet and 2
# TensorRT-LLM bmm GEMMs, 1 fmha; on Tensor Cores but no matrix work, bf16 norms (the CuTe DSL
# RMSNorm trap), RoPE, MoE routing/finalize, split-K reduce, an index-select. MI300X: 4 hipBLASLt
# GEMMs with MFMA tiles, 2 CK MoE GEMMs whose `unsigned short` operands say nothing, 1 paged
# attention on MFMA (its reduce kernel is no matrix work). H100 Qwen: 1 sm90 bf16 GEMM, 1 flash
# attention, 1 fp32 SIMT SGEMM.
CLASS_COUNTS = {
    B300_DECODE: {("attention", TC): 1, ("gemm", TC): 5, ("other", TC): 8, ("other", UNKNOWN): 20},
    MI300_DECODE: {
        ("attention", TC): 1,
        ("gemm", TC): 4,
        ("gemm", UNKNOWN): 2,
        ("other", TC): 8,
        ("other", UNKNOWN): 16,
    },
    H100_QWEN: {
        ("attention", TC): 1,
        ("gemm", FP32): 1,
        ("gemm", TC): 1,
        ("other", TC): 9,
        ("other", UNKNOWN): 14,
    },
}


@pytest.mark.parametrize("relative", sorted(CLASS_COUNTS), ids=lambda r: r.split("/")[-2])
def test_class_counts_of_real_traces(relative: str) -> None:
    names = _kernel_names(shared_trace(f"more/{relative}"))
    counts = Counter((classify(n).kind, classify(n).precision) for n in names)
    assert dict(counts) == CLASS_COUNTS[relative]


# Every file under more/: distinct kernel names that are matrix work, on Tensor/matrix Cores, and
# matrix work on the FP32 units. Only the A100 files and the one SGEMM of the H100 Qwen trace are
# fp32; the normalization test and the graph capture run no matrix work at all.
MATRIX_COUNTS = {
    "hta_extra/critical_path/simple_add/benchmark_result_493459_1694039959_trace.json.gz": (4, 1, 3),
    "switch_transformers/trace_100Kpar_4exp_8batch_128seq_1024.json.gz": (5, 0, 5),
    B300_DECODE: (6, 6, 0),
    MI300_DECODE: (7, 5, 0),
    "tracelens/h100/Falconsai_nsfw_image_detection__1016002.hf_token_redacted.json.gz": (6, 6, 0),
    H100_QWEN: (3, 2, 1),
    "tracelens/h100/google_owlv2-large-patch14-ensemble__1016001.hf_token_redacted.json.gz": (11, 9, 0),
    "tracelens/inference/vllm_decode_full/capture_traces/graph_capture_rank_0.1773709742341309550.pt.trace"
    ".json.gz": (0, 0, 0),
    "tracelens/inference/vllm_decode_full/graph_execution.json.gz": (8, 6, 0),
    "tracelens/inference/vllm_prefilldecode_piecewise/graph_execution.json.gz": (7, 6, 0),
    "tracelens/inference/xdit_flux.1_aiter_sage/profile_trace_rank_0.json.gz": (34, 32, 0),
    "tracelens/mi210/gpu_only_trace/gpu_only_trace.json.gz": (19, 19, 0),
    "tracelens/mi300/Qwen_Qwen1.5-0.5B-Chat__1016005.hf_token_redacted.json.gz": (4, 3, 0),
    "tracelens/perf_model/normalization/normalization_layer_test.json.gz": (0, 0, 0),
}


def test_every_kernel_of_the_development_traces() -> None:
    more = shared_trace("more")
    found = {}
    for path in sorted(more.rglob("*.json.gz")):
        classes = {name: classify(name) for name in _kernel_names(path)}
        found[path.relative_to(more).as_posix()] = (
            sum(c.matrix for c in classes.values()),
            sum(c.tensor_core for c in classes.values()),
            sum(c.fp32_matrix for c in classes.values()),
        )
        for name, c in classes.items():
            # Library families whose class the names settle, in every file.
            if name.startswith("Cijk_") or "nvjet" in name or name.startswith("sm90_xmma_gemm_bf16"):
                assert (c.kind, c.precision) == ("gemm", TC), name
            if name.startswith(("triton_poi_", "triton_per_", "triton_red_")):
                assert (c.kind, c.precision) == ("other", UNKNOWN), name
            if "norm" in name.lower() or "softmax" in name.lower():
                assert not c.matrix, name
    assert found == MATRIX_COUNTS
