//! Process-wide settings for a process that runs the `downpour` command (the binary, or
//! `python -m downpour` and the `downpour` script the Python package installs): set once, at
//! the start, before any thread; the processes it starts inherit them.

/// Applies what a node process needs: no transparent huge pages, and the soft open-files
/// limit raised to the hard limit. For the command's entry points only: a library that
/// embeds Downpour in a program of its own (the Python module's clusters and clients) leaves
/// the host process's settings alone. Failures change nothing and are not reported.
pub fn prepare() {
    no_transparent_huge_pages();
    more_open_files();
}

/// Raises this process's soft limit on open files to its hard limit (inherited by the
/// processes it starts). A node holds a socket per connection, and over gRPC each connection
/// also holds its runtime's epoll and event descriptors (three per connection), so the
/// common soft limit of 1,024 would stop a node at about 340 gRPC connections, below
/// `--max-connections`' default. A failure changes nothing and is not reported.
fn more_open_files() {
    #[cfg(unix)]
    // SAFETY: getrlimit/setrlimit read and write the one `rlimit` owned by this frame.
    unsafe {
        let mut l = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) == 0 && l.rlim_cur < l.rlim_max {
            l.rlim_cur = l.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &l);
        }
    }
}

/// Asks the kernel for no transparent huge pages in this process (and the processes it
/// starts, which inherit the setting). mimalloc backs its arenas with them where the kernel
/// allows: each fresh 2 MiB region is then zeroed whole at its first touch, and again after
/// mimalloc has given freed memory back, so a node whose tables and buffers grow (a training
/// job) spent up to two fifths of its CPU time in the kernel zeroing pages
/// (`clear_page_erms` under `finish_grow`, `perf record`). Without them a `train linear` job
/// of processes that each have a CPU quota (machines of their own) runs in 0.58–0.70× the
/// time, one on a shared machine in the same time at half the peak memory, and the steady
/// state of `downpour bench` (buffers and tables grown once) is unchanged (docs/benchmarks.md,
/// "Transparent huge pages"). A failure (an old kernel) changes nothing and is not reported.
fn no_transparent_huge_pages() {
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_THP_DISABLE takes plain integer arguments and touches no memory of ours.
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
}
