//! The measuring tools' own parts (`talos_sso_tests::load`): what they
//! read of the machine, checked here so that a figure they print cannot be
//! wrong unnoticed.

use std::time::{Duration, Instant};

use talos_sso_tests::load::{StatTimes, own_cpu};

/// A `/proc/<pid>/stat` line gives its command (which may hold spaces and
/// parentheses) and its CPU times: user, system and reaped children
/// (cutime + cstime), in USER_HZ ticks of 10 ms.
#[test]
fn a_stat_line_gives_its_command_and_times() {
    let line =
        "812 (post gres)) S 1 812 812 0 -1 4194560 1234 5678 0 0 150 37 42 9 20 0 1 0 1000 229859328 6000";
    let times = StatTimes::parse(line).unwrap();
    assert_eq!(times.command, "post gres)");
    assert_eq!(times.user, Duration::from_millis(1500));
    assert_eq!(times.system, Duration::from_millis(370));
    assert_eq!(times.reaped, Duration::from_millis(510));
    // Cut short: no times to give.
    assert_eq!(StatTimes::parse("812 (postgres) S 1"), None);
}

/// This process's CPU time grows by what it spends: 300 ms of spinning
/// reads as at least 200 ms (ticks of 10 ms, and a busy machine may take
/// the core away for a while, which counts as wall time only).
#[test]
fn this_process_cpu_time_counts_what_it_spends() {
    let before = own_cpu();
    let started = Instant::now();
    let mut spin = 0u64;
    while started.elapsed() < Duration::from_millis(300) || own_cpu() - before < Duration::from_millis(200) {
        spin = std::hint::black_box(spin.wrapping_add(1));
        assert!(started.elapsed() < Duration::from_secs(20), "no CPU time counted");
    }
}
