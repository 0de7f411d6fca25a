"""Kernel classification by name: real kernel names from public traces and profiles (the shared
traces, TensorBoard/HTA samples, nsys tables and issues quoting them), each with its class."""

from __future__ import annotations

import pytest

from trainadvisor.analysis.kernels import classify

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


@pytest.mark.parametrize(("name", "kind", "precision"), NAMES, ids=[n[0][:60] for n in NAMES])
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
