"""bench/device/sort_oom.py's table: medians over the runs (the mean of the middle two for an
even count), the time over completed runs only, OOM kills counted."""

from bench.device import sort_oom


def run(seconds, killed=False, failcnt=0, wb=0):
    return {"seconds": seconds, "killed": killed, "failcnt": failcnt, "peak_writeback_pages": wb}


def test_even_counts_take_the_mean_of_the_middle_two():
    lines = sort_oom.summary({"fuse": [run(161.5, failcnt=1631165, wb=4006), run(124.3, failcnt=1587417, wb=4030)]})
    assert lines[2] == "| fuse | 2 | 0 | 142.9 | 1609291 | 4018 |"


def test_killed_runs_count_but_have_no_time():
    rs = [run(10.0), run(99.0, killed=True), run(12.0)]
    assert sort_oom.summary({"zram": rs})[2] == "| zram | 3 | 1 | 11.0 | 0 | 0 |"
    assert sort_oom.summary({"zram": [run(5.0, killed=True)]})[2] == "| zram | 1 | 1 | nan | 0 | 0 |"
