import pytest

from measure_agent.workload import WorkloadError, make_workload, parse_workload


def test_parse_canonical_key_defaults_dtype():
    w = parse_workload("matmul(M=512,N=512,K=512)")
    assert w.op == "matmul"
    assert w.params == {"M": 512, "N": 512, "K": 512}
    assert w.dtype == "float32"
    assert w.key == "matmul(M=512,N=512,K=512,dtype=float32)"


def test_spellings_share_one_key():
    a = parse_workload(" matmul( K=3, N=2 ,M=1 ) ")
    b = parse_workload("matmul(M=1,N=2,K=3,dtype=float32)")
    assert a == b and a.key == b.key
    assert parse_workload(a.key) == a


def test_float64_allowed_and_flops():
    w = parse_workload("matmul(M=2,N=3,K=4,dtype=float64)")
    assert w.dtype == "float64"
    assert w.flops == 2 * 2 * 3 * 4


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("conv9(M=1)", "unknown operator 'conv9'"),
        ("matmul(M=1,N=2)", "missing size K"),
        ("matmul(M=1,N=2,K=x)", "K=x of matmul is not an integer"),
        ("matmul(M=1,N=2,K=2.5)", "not an integer"),
        ("matmul(M=0,N=2,K=2)", "M=0 of matmul must be positive"),
        ("matmul(M=-4,N=2,K=2)", "must be positive"),
        ("matmul(M=1,N=2,K=2,dtype=int8)", "unsupported dtype"),
        ("matmul(M=1,N=2,K=2,Q=3)", "unknown argument 'Q'"),
        ("matmul(M=1,M=2,N=2,K=2)", "given twice"),
        ("matmul M=1", "cannot parse"),
        ("", "empty workload"),
        ("matmul(M=1,N=2,K=9999999)", "exceeds the limit"),
    ],
)
def test_bad_workloads_name_the_problem(text, fragment):
    with pytest.raises(WorkloadError) as info:
        parse_workload(text)
    assert fragment in str(info.value)
    assert "\n" not in str(info.value)


def test_make_workload_from_ints():
    assert make_workload("matmul", {"M": 4, "N": 5, "K": 6}).key == "matmul(M=4,N=5,K=6,dtype=float32)"


def test_conv_workloads_default_and_per_axis_window():
    w = parse_workload("conv2d_nchw(N=1,C=64,H=56,W=56,K=64,R=3,S=3,stride=1,pad=1)")
    assert w.key == "conv2d_nchw(N=1,C=64,H=56,W=56,K=64,R=3,S=3,stride=1,pad=1,dilation=1,dtype=float32)"
    assert w["stride_h"] == w["stride_w"] == 1 and w["pad_h"] == 1
    assert w.flops == 2 * 64 * 56 * 56 * 64 * 9
    per_axis = parse_workload("conv2d_nhwc(N=1,C=3,H=8,W=8,K=4,R=3,S=3,stride_h=2,stride_w=1,pad_h=0,pad_w=1)")
    assert "stride_h=2,stride_w=1,pad_h=0,pad_w=1" in per_axis.key
    assert parse_workload(per_axis.key) == per_axis
    dw = parse_workload("depthwise_conv2d_nchw(N=1,C=32,H=112,W=112,R=3,S=3,stride=1,pad=1)")
    assert dw["multiplier"] == 1
    assert parse_workload("dense(M=1,N=1000,K=2048)").spec.output_shape({"M": 1, "N": 1000, "K": 2048}) == (1, 1000)


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("conv2d_nchw(N=1,C=1,H=2,W=2,K=1,R=5,S=5)", "window does not fit"),
        ("conv2d_nchw(N=1,C=1,H=4,W=4,K=1,R=1,S=1,pad=-1)", "must be at least 0"),
        ("conv2d_nchw(N=1,C=1,H=4,W=4,K=1,R=1,S=1,pad=1,pad_h=2)", "not both"),
        ("matmul(M=65536,N=65536,K=2)", "more than the limit"),
        ("depthwise_conv2d_nhwc(N=1,C=1,H=4,W=4,R=3)", "missing size S"),
    ],
)
def test_bad_conv_and_oversize_workloads(text, fragment):
    with pytest.raises(WorkloadError, match=fragment):
        parse_workload(text)


@pytest.mark.parametrize(
    "compact, canonical",
    [
        ("matmul_512x512x512", "matmul(M=512,N=512,K=512,dtype=float32)"),
        ("dense_1x1000x2048", "dense(M=1,N=1000,K=2048,dtype=float32)"),
        ("batch_matmul_8x128x128x64_float64", "batch_matmul(B=8,M=128,N=128,K=64,dtype=float64)"),
        ("conv2d_nchw_1x64x56x56_k64_r3s3_s1_p1",
         "conv2d_nchw(N=1,C=64,H=56,W=56,K=64,R=3,S=3,stride=1,pad=1,dilation=1,dtype=float32)"),
        ("conv2d_nhwc_1x8x9x9_k4_r3s3_s2x1_p1x0_d2",
         "conv2d_nhwc(N=1,C=8,H=9,W=9,K=4,R=3,S=3,stride_h=2,stride_w=1,pad_h=1,pad_w=0,dilation=2,dtype=float32)"),
        ("depthwise_conv2d_nchw_1x32x112x112_r3s3_s1_p1_m2",
         "depthwise_conv2d_nchw(N=1,C=32,H=112,W=112,R=3,S=3,stride=1,pad=1,dilation=1,multiplier=2,dtype=float32)"),
    ],
)
def test_compact_forms(compact, canonical):
    assert parse_workload(compact).key == canonical


@pytest.mark.parametrize(
    "compact, fragment",
    [
        ("matmul_512x512", "2 sizes given, matmul takes 3"),
        ("conv2d_nchw_1x64x56x56_r3s3", "missing K"),
        ("conv2d_nchw_1x64x56x56_k64_r3s3_q1", "unknown segment 'q1'"),
        ("conv2d_nchw_1x64x56x56_k64_k32_r3s3", "given twice"),
        ("matmul_512x512x512_k3", "takes nothing after its sizes"),
        ("dense_k3_1x2x3", "the sizes must come first"),
    ],
)
def test_ambiguous_compact_forms_are_refused_with_the_canonical_syntax(compact, fragment):
    with pytest.raises(WorkloadError) as info:
        parse_workload(compact)
    assert fragment in str(info.value) and "write it as" in str(info.value) and "(" in str(info.value)
