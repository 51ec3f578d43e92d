import pytest

from advisor.inputs import (
    GpuRange,
    InputError,
    check_whole_nodes,
    default_global_batch,
    parse_count,
    parse_fraction,
    parse_gpus,
    parse_seq,
    step_global_batch,
)


@pytest.mark.parametrize("text,tokens", [("4096", 4096), ("4k", 4096), ("32k", 32768), ("32K", 32768),
                                         ("1M", 1048576), ("1.5k", 1536), (" 128k ", 131072)])
def test_seq_accepts_binary_multiples(text, tokens):
    assert parse_seq(text) == tokens


@pytest.mark.parametrize("text", ["", "32q", "k", "-4k", "0", "1.3", "4kk", "1B"])
def test_seq_rejects_with_the_option_named(text):
    with pytest.raises(InputError, match="--seq"):
        parse_seq(text)


def test_counts_are_decimal():
    assert parse_count("1B") == 10**9
    assert parse_count("500M") == 5 * 10**8
    assert parse_count("1e9") == 10**9
    assert parse_count("2T") == 2 * 10**12
    with pytest.raises(InputError, match="--tokens"):
        parse_count("lots")


def test_gpus_count_and_range():
    assert parse_gpus("8") == GpuRange(8, 8) and parse_gpus(8).fixed
    r = parse_gpus("4-64")
    assert not r.fixed
    assert r.counts(4) == [4, 8, 16, 32, 64]
    assert parse_gpus("1-12").counts(4) == [1, 2, 4, 8, 12]
    assert parse_gpus("2-8").counts(8) == [2, 4, 8]
    for bad in ("0", "8-4", "four", "4-", "-4"):
        with pytest.raises(InputError, match="--gpus"):
            parse_gpus(bad)
    with pytest.raises(InputError, match="whole nodes"):
        parse_gpus("5-7").counts(4)


def test_whole_nodes():
    check_whole_nodes(2, 4)
    check_whole_nodes(12, 4)
    with pytest.raises(InputError, match="whole nodes of 4"):
        check_whole_nodes(6, 4)


def test_fraction():
    assert parse_fraction("10%") == pytest.approx(0.10)
    assert parse_fraction("0.25") == pytest.approx(0.25)
    assert parse_fraction("0%") == 0
    for bad in ("10", "ten%", "-5%", "nan"):
        with pytest.raises(InputError, match="--max-slowdown"):
            parse_fraction(bad)


def test_global_batch_is_about_a_million_tokens_and_rounds_up():
    assert default_global_batch(32768) == 32
    assert default_global_batch(4096) == 256
    assert default_global_batch(2**21) == 1
    assert step_global_batch(32, 8, 2) == (32, 2)
    assert step_global_batch(32, 12, 1) == (36, 3)  # rounded up so dp * micro divides it
    assert step_global_batch(1, 8, 1) == (8, 1)
