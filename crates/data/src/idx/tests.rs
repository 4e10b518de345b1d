//! Tests of [`super`] (`idx.rs`).
use super::*;
use flate2::write::GzEncoder;
use flate2::Compression;
use proptest::prelude::*;
use std::io::Write;

/// Largest single allocation made by each thread, to check that a lying header reserves
/// nothing large. Delegates to the system allocator (the default anyway).
mod alloc_probe {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    pub struct Probe;

    thread_local! {
        static LARGEST: Cell<usize> = const { Cell::new(0) };
    }

    fn note(size: usize) {
        let _ = LARGEST.try_with(|c| c.set(c.get().max(size)));
    }

    unsafe impl GlobalAlloc for Probe {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            note(layout.size());
            // SAFETY: forwarded unchanged to the system allocator.
            unsafe { System.alloc(layout) }
        }
        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            note(layout.size());
            // SAFETY: forwarded unchanged to the system allocator.
            unsafe { System.alloc_zeroed(layout) }
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: forwarded unchanged to the system allocator.
            unsafe { System.dealloc(ptr, layout) }
        }
        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            note(new_size);
            // SAFETY: forwarded unchanged to the system allocator.
            unsafe { System.realloc(ptr, layout, new_size) }
        }
    }

    #[global_allocator]
    static GLOBAL: Probe = Probe;

    /// Resets this thread's record and returns the largest allocation made during `f`.
    pub fn largest_during<T>(f: impl FnOnce() -> T) -> (T, usize) {
        LARGEST.with(|c| c.set(0));
        let out = f();
        (out, LARGEST.with(|c| c.get()))
    }
}

/// Test-only encoder: header then big-endian elements.
fn encode(a: &IdxArray) -> Vec<u8> {
    let mut out = vec![0, 0, a.data.idx_type().code(), a.dims.len() as u8];
    for &d in &a.dims {
        out.extend_from_slice(&(d as u32).to_be_bytes());
    }
    match &a.data {
        IdxData::U8(v) => out.extend_from_slice(v),
        IdxData::I8(v) => out.extend(v.iter().map(|&x| x as u8)),
        IdxData::I16(v) => v.iter().for_each(|x| out.extend_from_slice(&x.to_be_bytes())),
        IdxData::I32(v) => v.iter().for_each(|x| out.extend_from_slice(&x.to_be_bytes())),
        IdxData::F32(v) => v.iter().for_each(|x| out.extend_from_slice(&x.to_be_bytes())),
        IdxData::F64(v) => v.iter().for_each(|x| out.extend_from_slice(&x.to_be_bytes())),
    }
    out
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = GzEncoder::new(Vec::new(), Compression::default());
    enc.write_all(bytes).unwrap();
    enc.finish().unwrap()
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

/// A header alone: magic, type, dims.
fn header(code: u8, dims: &[u32]) -> Vec<u8> {
    let mut out = vec![0, 0, code, dims.len() as u8];
    for d in dims {
        out.extend_from_slice(&d.to_be_bytes());
    }
    out
}

fn samples() -> Vec<IdxArray> {
    vec![
        IdxArray { dims: vec![2, 3], data: IdxData::U8(vec![0, 1, 2, 253, 254, 255]) },
        IdxArray { dims: vec![4], data: IdxData::I8(vec![-128, -1, 0, 127]) },
        IdxArray { dims: vec![2, 1, 2], data: IdxData::I16(vec![i16::MIN, -2, 0x1234, i16::MAX]) },
        IdxArray { dims: vec![3], data: IdxData::I32(vec![i32::MIN, 0x0102_0304, i32::MAX]) },
        IdxArray { dims: vec![1, 3], data: IdxData::F32(vec![-1.5, 0.0, f32::MAX]) },
        IdxArray { dims: vec![2], data: IdxData::F64(vec![std::f64::consts::PI, -1e300]) },
        IdxArray { dims: vec![0, 5], data: IdxData::I32(vec![]) },
    ]
}

#[test]
fn idx_round_trips_every_type_plain_and_gzip() {
    let d = tempfile::tempdir().unwrap();
    for (i, a) in samples().into_iter().enumerate() {
        let bytes = encode(&a);
        assert_eq!(parse_idx(&bytes).unwrap(), a, "in memory, {:?}", a.data.idx_type());
        let plain = write(d.path(), &format!("a{i}.idx"), &bytes);
        assert_eq!(read_idx(&plain).unwrap(), a, "plain {:?}", a.data.idx_type());
        // named without .gz: recognised by its magic bytes
        let gz = write(d.path(), &format!("b{i}.idx"), &gzip(&bytes));
        assert_eq!(read_idx(&gz).unwrap(), a, "gzip {:?}", a.data.idx_type());
    }
}

#[test]
fn idx_big_endian_layout() {
    let bytes = [0, 0, 0x0B, 1, 0, 0, 0, 2, 0x01, 0x02, 0xFF, 0xFE];
    let a = parse_idx(&bytes).unwrap();
    assert_eq!(a.dims, vec![2]);
    assert_eq!(a.data, IdxData::I16(vec![0x0102, -2]));
}

/// Runs `bytes` through `parse_idx` and, plain and gzipped, through `read_idx`; checks each
/// error with `check` and that its message names the input.
fn all_fail(bytes: &[u8], check: impl Fn(&IdxError) -> bool) {
    let e = parse_idx(bytes).unwrap_err();
    assert!(check(&e), "in memory: {e:?}");
    assert!(e.to_string().starts_with("<memory>: "), "{e}");
    let d = tempfile::tempdir().unwrap();
    for (name, content) in [("plain.idx", bytes.to_vec()), ("zipped.idx", gzip(bytes))] {
        let p = write(d.path(), name, &content);
        let e = read_idx(&p).unwrap_err();
        assert!(check(&e), "{name}: {e:?}");
        assert!(e.to_string().starts_with(&format!("{}: ", p.display())), "{e}");
    }
}

#[test]
fn idx_error_bad_magic_shows_bytes() {
    all_fail(b"\x01\x02\x08\x01rest", |e| matches!(e, IdxError::NotIdx { found, .. } if found == &[1, 2, 8, 1]));
    assert!(parse_idx(b"\x01\x02\x08\x01").unwrap_err().to_string().contains("its first bytes are 01 02 08 01,"));
    all_fail(b"", |e| matches!(e, IdxError::NotIdx { found, .. } if found.is_empty()));
    assert!(parse_idx(b"").unwrap_err().to_string().contains("empty"));
    all_fail(b"\0\0\x08", |e| matches!(e, IdxError::NotIdx { found, .. } if found == &[0, 0, 8]));
}

#[test]
fn idx_error_unknown_type() {
    all_fail(&header(0x0A, &[1]), |e| matches!(e, IdxError::UnknownType { code: 0x0A, .. }));
    assert!(parse_idx(&header(0x0A, &[1])).unwrap_err().to_string().contains("0x0a"));
}

#[test]
fn idx_error_zero_dims() {
    all_fail(&header(0x08, &[]), |e| matches!(e, IdxError::ZeroDims { .. }));
}

#[test]
fn idx_error_truncated_header() {
    let mut h = header(0x08, &[3, 4]);
    h.truncate(9);
    all_fail(&h, |e| matches!(e, IdxError::TruncatedHeader { ndims: 2, expected: 12, found: 9, .. }));
}

#[test]
fn idx_error_too_large_and_overflow() {
    // 2^16 * 2^16 * 2 bytes = 8 GiB
    all_fail(&header(0x0B, &[1 << 16, 1 << 16]), |e| matches!(e, IdxError::TooLarge { bytes: Some(b), .. } if *b == 8 << 30));
    // 4 GiB + 1 element of u8
    all_fail(&header(0x08, &[(1 << 31) + 1, 2]), |e| matches!(e, IdxError::TooLarge { bytes: Some(_), .. }));
    // overflows u64
    all_fail(&header(0x0E, &[u32::MAX, u32::MAX, u32::MAX]), |e| matches!(e, IdxError::TooLarge { bytes: None, .. }));
    let msg = parse_idx(&header(0x0E, &[u32::MAX, u32::MAX, u32::MAX])).unwrap_err().to_string();
    assert!(msg.contains("overflows"), "{msg}");
    // exactly 4 GiB is allowed by the limit (and then truncated here)
    all_fail(&header(0x08, &[1 << 16, 1 << 16]), |e| matches!(e, IdxError::Truncated { expected, found: 0, .. } if *expected == 4 << 30));
}

#[test]
fn idx_error_truncated_data() {
    let mut bytes = encode(&IdxArray { dims: vec![3], data: IdxData::I32(vec![1, 2, 3]) });
    bytes.truncate(bytes.len() - 3);
    all_fail(&bytes, |e| matches!(e, IdxError::Truncated { expected: 12, found: 9, .. }));
    let msg = parse_idx(&bytes).unwrap_err().to_string();
    assert!(msg.contains("expected 12 data bytes, found 9"), "{msg}");
}

#[test]
fn idx_error_trailing_data() {
    let mut bytes = encode(&IdxArray { dims: vec![2], data: IdxData::U8(vec![1, 2]) });
    bytes.push(0);
    all_fail(&bytes, |e| matches!(e, IdxError::TrailingData { declared: 2, .. }));
}

#[test]
fn idx_error_truncated_gzip() {
    let a = IdxArray { dims: vec![1000], data: IdxData::I32((0..1000).collect()) };
    let gz = gzip(&encode(&a));
    let d = tempfile::tempdir().unwrap();
    // cut in the middle of the deflate stream, and just before the CRC/size trailer ends
    for cut in [gz.len() / 2, gz.len() - 3] {
        let p = write(d.path(), &format!("cut{cut}.idx.gz"), &gz[..cut]);
        let e = read_idx(&p).unwrap_err();
        assert!(matches!(e, IdxError::BadGzip { .. } | IdxError::Truncated { .. }), "cut at {cut}: {e:?}");
        assert!(e.to_string().starts_with(&format!("{}: ", p.display())), "{e}");
    }
    // a whole stream with its trailer cut is a bad stream, never a silent success
    let p = write(d.path(), "notrailer.gz", &gz[..gz.len() - 8]);
    assert!(matches!(read_idx(&p).unwrap_err(), IdxError::BadGzip { .. }));
}

#[test]
fn idx_error_corrupt_gzip() {
    let a = IdxArray { dims: vec![1000], data: IdxData::I32((0..1000).collect()) };
    let mut gz = gzip(&encode(&a));
    let n = gz.len();
    gz[n - 6] ^= 0xFF; // the CRC
    let d = tempfile::tempdir().unwrap();
    let p = write(d.path(), "crc.idx", &gz);
    let e = read_idx(&p).unwrap_err();
    assert!(matches!(e, IdxError::BadGzip { .. }), "{e:?}");
    assert!(e.to_string().contains("bad gzip stream"), "{e}");
    // gzip bytes given to parse_idx are not IDX
    assert!(matches!(parse_idx(&gz).unwrap_err(), IdxError::NotIdx { .. }));
}

#[test]
fn idx_error_io_names_file() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("absent.idx");
    let e = read_idx(&p).unwrap_err();
    assert!(matches!(e, IdxError::Io { .. }), "{e:?}");
    assert!(e.to_string().starts_with(&format!("{}: ", p.display())), "{e}");
    assert!(std::error::Error::source(&e).is_some());
}

#[test]
fn idx_huge_header_tiny_body_allocates_nothing_large() {
    // declares 4 GiB of u8 (the limit) over a 10-byte body, plain and gzipped
    let mut bytes = header(0x08, &[1 << 16, 1 << 16]);
    bytes.extend_from_slice(&[7; 10]);
    let d = tempfile::tempdir().unwrap();
    for (name, content) in [("plain.idx", bytes.clone()), ("zipped.idx", gzip(&bytes))] {
        let p = write(d.path(), name, &content);
        let (r, largest) = alloc_probe::largest_during(|| read_idx(&p));
        assert!(matches!(r, Err(IdxError::Truncated { found: 10, .. })), "{name}: {r:?}");
        assert!(largest < 1 << 20, "{name}: allocated {largest} bytes at once");
    }
    let (r, largest) = alloc_probe::largest_during(|| parse_idx(&bytes));
    assert!(matches!(r, Err(IdxError::Truncated { found: 10, .. })));
    assert!(largest < 1 << 20, "allocated {largest} bytes at once");
}

#[test]
fn idx_gzip_bomb_reads_no_more_than_declared() {
    // 4 bytes declared, 8 MiB of zeros behind them: refused after reading 5 data bytes
    let mut bytes = header(0x08, &[4]);
    bytes.resize(bytes.len() + (8 << 20), 0);
    let gz = gzip(&bytes);
    drop(bytes);
    let d = tempfile::tempdir().unwrap();
    let p = write(d.path(), "bomb", &gz);
    let (r, largest) = alloc_probe::largest_during(|| read_idx(&p));
    assert!(matches!(r, Err(IdxError::TrailingData { declared: 4, .. })), "{r:?}");
    assert!(largest < 1 << 20, "allocated {largest} bytes at once");
}

fn write_images(dir: &Path, name: &str, count: u32, rows: u32, cols: u32) -> PathBuf {
    let mut b = header(0x08, &[count, rows, cols]);
    b.extend((0..count * rows * cols).map(|i| i as u8));
    write(dir, name, &b)
}

fn write_labels(dir: &Path, name: &str, count: u32) -> PathBuf {
    let mut b = header(0x08, &[count]);
    b.extend((0..count).map(|i| (i % 10) as u8));
    write(dir, name, &b)
}

#[test]
fn idx_read_labeled_images() {
    let d = tempfile::tempdir().unwrap();
    let imgs = write_images(d.path(), "imgs", 3, 2, 4);
    let labs = write_labels(d.path(), "labs", 3);
    let l = read_labeled(&imgs, &labs).unwrap();
    assert_eq!((l.images.count, l.images.rows, l.images.cols), (3, 2, 4));
    assert_eq!(l.images.image(1), Some(&(8u8..16).collect::<Vec<_>>()[..]));
    assert_eq!(l.images.image(3), None);
    assert_eq!(l.labels, vec![0, 1, 2]);
}

#[test]
fn idx_read_labeled_count_mismatch() {
    let d = tempfile::tempdir().unwrap();
    let imgs = write_images(d.path(), "imgs", 3, 2, 2);
    let labs = write_labels(d.path(), "labs", 4);
    let e = read_labeled(&imgs, &labs).unwrap_err();
    assert!(matches!(e, IdxError::CountMismatch { image_count: 3, label_count: 4, .. }), "{e:?}");
    let msg = e.to_string();
    for part in [imgs.display().to_string(), labs.display().to_string(), "3 images".into(), "4 labels".into()] {
        assert!(msg.contains(&part), "{msg} lacks {part}");
    }
}

#[test]
fn idx_wrong_shape_names_file() {
    let d = tempfile::tempdir().unwrap();
    let x = write(d.path(), "x.idx", &encode(&IdxArray { dims: vec![1, 2], data: IdxData::I32(vec![1, 2]) }));
    let e = read_images(&x).unwrap_err();
    assert!(matches!(e, IdxError::WrongShape { found: IdxType::I32, ndims: 2, .. }), "{e:?}");
    assert_eq!(e.to_string(), format!("{}: expected an image file (u8, 3 dimensions), found i32 with 2 dimensions", x.display()));
    let e = read_labels(&x).unwrap_err();
    assert_eq!(e.to_string(), format!("{}: expected a label file (u8, 1 dimension), found i32 with 2 dimensions", x.display()));
    // right type, wrong rank
    let labs = write_labels(d.path(), "labs", 3);
    let e = read_images(&labs).unwrap_err();
    assert!(matches!(e, IdxError::WrongShape { found: IdxType::U8, ndims: 1, .. }), "{e:?}");
    assert!(e.to_string().ends_with("found u8 with 1 dimension"), "{e}");
    let imgs = write_images(d.path(), "imgs", 1, 1, 1);
    assert!(matches!(read_labels(&imgs).unwrap_err(), IdxError::WrongShape { found: IdxType::U8, ndims: 3, .. }));
}

#[test]
fn idx_find_mnist_both_spellings() {
    let d = tempfile::tempdir().unwrap();
    for n in ["train-images-idx3-ubyte.gz", "train-labels.idx1-ubyte", "t10k-images.idx3-ubyte.gz", "t10k-labels-idx1-ubyte"] {
        write(d.path(), n, b"");
    }
    let f = find_mnist(d.path()).unwrap();
    assert_eq!(f.train_images, d.path().join("train-images-idx3-ubyte.gz"));
    assert_eq!(f.train_labels, d.path().join("train-labels.idx1-ubyte"));
    assert_eq!(f.test_images, d.path().join("t10k-images.idx3-ubyte.gz"));
    assert_eq!(f.test_labels, d.path().join("t10k-labels-idx1-ubyte"));
    // the plain dash spelling is preferred when several exist
    write(d.path(), "train-images-idx3-ubyte", b"");
    assert_eq!(find_mnist(d.path()).unwrap().train_images, d.path().join("train-images-idx3-ubyte"));
}

#[test]
fn idx_find_mnist_missing_names_dir_and_names() {
    let d = tempfile::tempdir().unwrap();
    for n in ["train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte"] {
        write(d.path(), n, b"");
    }
    // a directory of the right name is not a file
    std::fs::create_dir(d.path().join("t10k-labels-idx1-ubyte.gz")).unwrap();
    let e = find_mnist(d.path()).unwrap_err();
    let IdxError::MnistMissing { looked_for, .. } = &e else { panic!("{e:?}") };
    assert_eq!(looked_for, &["t10k-labels-idx1-ubyte[.gz] or t10k-labels.idx1-ubyte[.gz]"]);
    let msg = e.to_string();
    assert!(msg.starts_with(&format!("{}: ", d.path().display())), "{msg}");
    let e = find_mnist(&d.path().join("nowhere")).unwrap_err();
    let IdxError::MnistMissing { looked_for, .. } = &e else { panic!("{e:?}") };
    assert_eq!(looked_for.len(), 4);
}

/// The real MNIST test set, when the shared data folder is there (CI clones may lack it).
#[test]
fn idx_reads_real_mnist_t10k() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/mnist");
    if !dir.is_dir() {
        return;
    }
    let f = find_mnist(&dir).unwrap();
    let l = read_labeled(&f.test_images, &f.test_labels).unwrap();
    assert_eq!((l.images.count, l.images.rows, l.images.cols), (10_000, 28, 28));
    assert_eq!(l.images.pixels.len(), 10_000 * 28 * 28);
    assert_eq!(l.labels.len(), 10_000);
    assert!(l.labels.iter().all(|&y| y < 10));
}

proptest! {
    #[test]
    fn idx_parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = parse_idx(&bytes);
    }

    #[test]
    fn idx_parse_never_panics_on_idx_like_input(
        code in prop::sample::select(vec![0x08u8, 0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x0E]),
        dims in proptest::collection::vec(0u32..6, 0..4),
        body in proptest::collection::vec(any::<u8>(), 0..128),
    ) {
        let mut bytes = header(code, &dims);
        bytes.extend_from_slice(&body);
        if let Ok(a) = parse_idx(&bytes) {
            prop_assert_eq!(a.dims.iter().product::<usize>(), a.data.len());
            prop_assert_eq!(encode(&a), bytes);
        }
    }
}
