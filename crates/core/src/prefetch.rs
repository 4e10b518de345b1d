//! Software prefetch hints for loops that know which memory they read next (a hash walk's
//! slot a few keys ahead, a shuffle window's chosen example).

/// Asks the CPU to bring the cache line holding `p` into all cache levels. A hint: it never
/// faults, whatever the address (dangling, null or unmapped), and does nothing on targets
/// without the instruction.
#[inline]
pub fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetching is a hint; it never faults, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Prefetches every cache line that the first `max_bytes` bytes of `s` touch (all of `s`
/// when it is shorter).
#[inline]
pub fn prefetch_slice<T>(s: &[T], max_bytes: usize) {
    const LINE: usize = 64;
    let bytes = std::mem::size_of_val(s).min(max_bytes);
    if bytes == 0 {
        return;
    }
    let first = s.as_ptr() as usize & !(LINE - 1);
    let last = s.as_ptr() as usize + bytes - 1;
    let mut line = first;
    while line <= last {
        prefetch(line as *const u8);
        line += LINE;
    }
}
