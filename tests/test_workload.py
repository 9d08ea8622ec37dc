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
