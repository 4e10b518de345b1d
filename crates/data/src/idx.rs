//! IDX files (the MNIST format), plain or gzip.
//!
//! Layout: two zero bytes, a type byte (`0x08` u8, `0x09` i8, `0x0B` i16, `0x0C` i32,
//! `0x0D` f32, `0x0E` f64), a dimension-count byte, each dimension as a big-endian u32, then
//! the elements big-endian in row-major order. Nothing may follow the data.
//!
//! [`read_idx`] decompresses gzip files transparently, recognising them by their magic bytes
//! (`1f 8b`) whatever their name. The declared data size (the product of the dimensions times
//! the element size) is checked before anything is read and may not exceed [`MAX_DATA_BYTES`];
//! at most that many bytes plus one are taken from the decompressor, so neither a lying header
//! nor a gzip bomb can make the reader allocate more than the file's real contents.
//!
//! Every error names the file (`<memory>` for [`parse_idx`]) and says what is wrong.
//! [`read_images`], [`read_labels`], [`read_labeled`] and [`find_mnist`] are the MNIST
//! conveniences on top.

use flate2::read::MultiGzDecoder;
use std::fmt;
use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use thiserror::Error;

/// The largest declared data size accepted: 4 GiB.
pub const MAX_DATA_BYTES: u64 = 4 << 30;

/// The name [`parse_idx`] gives its buffer in errors.
pub const MEMORY_NAME: &str = "<memory>";

/// Largest ratio of decompressed to compressed size a deflate stream can reach (about 1032:1);
/// bounds the buffer reserved up front for a gzip file.
const MAX_DEFLATE_RATIO: u64 = 1032;

/// The element type of an IDX file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IdxType {
    /// `0x08`: unsigned byte.
    U8,
    /// `0x09`: signed byte.
    I8,
    /// `0x0B`: big-endian i16.
    I16,
    /// `0x0C`: big-endian i32.
    I32,
    /// `0x0D`: big-endian f32.
    F32,
    /// `0x0E`: big-endian f64.
    F64,
}

impl IdxType {
    /// The type for a header's type byte; `None` for an unknown one.
    pub fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            0x08 => IdxType::U8,
            0x09 => IdxType::I8,
            0x0B => IdxType::I16,
            0x0C => IdxType::I32,
            0x0D => IdxType::F32,
            0x0E => IdxType::F64,
            _ => return None,
        })
    }

    /// The header's type byte for this type.
    pub fn code(self) -> u8 {
        match self {
            IdxType::U8 => 0x08,
            IdxType::I8 => 0x09,
            IdxType::I16 => 0x0B,
            IdxType::I32 => 0x0C,
            IdxType::F32 => 0x0D,
            IdxType::F64 => 0x0E,
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            IdxType::U8 | IdxType::I8 => 1,
            IdxType::I16 => 2,
            IdxType::I32 | IdxType::F32 => 4,
            IdxType::F64 => 8,
        }
    }

    /// The Rust name of the type (`u8`, `i16`, ...), as errors show it.
    pub fn name(self) -> &'static str {
        match self {
            IdxType::U8 => "u8",
            IdxType::I8 => "i8",
            IdxType::I16 => "i16",
            IdxType::I32 => "i32",
            IdxType::F32 => "f32",
            IdxType::F64 => "f64",
        }
    }
}

impl fmt::Display for IdxType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The elements of an IDX array, row-major, in their native type.
#[derive(Clone, Debug, PartialEq)]
pub enum IdxData {
    /// `0x08` elements.
    U8(Vec<u8>),
    /// `0x09` elements.
    I8(Vec<i8>),
    /// `0x0B` elements.
    I16(Vec<i16>),
    /// `0x0C` elements.
    I32(Vec<i32>),
    /// `0x0D` elements.
    F32(Vec<f32>),
    /// `0x0E` elements.
    F64(Vec<f64>),
}

impl IdxData {
    /// The element type.
    pub fn idx_type(&self) -> IdxType {
        match self {
            IdxData::U8(_) => IdxType::U8,
            IdxData::I8(_) => IdxType::I8,
            IdxData::I16(_) => IdxType::I16,
            IdxData::I32(_) => IdxType::I32,
            IdxData::F32(_) => IdxType::F32,
            IdxData::F64(_) => IdxType::F64,
        }
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        match self {
            IdxData::U8(v) => v.len(),
            IdxData::I8(v) => v.len(),
            IdxData::I16(v) => v.len(),
            IdxData::I32(v) => v.len(),
            IdxData::F32(v) => v.len(),
            IdxData::F64(v) => v.len(),
        }
    }

    /// Whether there are no elements (some dimension is zero).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A whole IDX file: its dimensions (at least one; the product is `data.len()`) and elements.
#[derive(Clone, Debug, PartialEq)]
pub struct IdxArray {
    /// The dimensions, outermost first (for MNIST images: count, rows, columns).
    pub dims: Vec<usize>,
    /// The elements, row-major.
    pub data: IdxData,
}

/// What is wrong with an IDX file; every message starts with the file's name.
#[derive(Debug, Error)]
pub enum IdxError {
    /// The file could not be opened or read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// The file is gzip but its stream is corrupt or cut short.
    #[error("{path}: bad gzip stream: {source}")]
    BadGzip {
        /// The file.
        path: PathBuf,
        /// The decompressor's error.
        source: io::Error,
    },
    /// The first two bytes are not zero (or the file is shorter than the 4-byte magic).
    #[error("{path}: not an IDX file: its first bytes are {}, an IDX file starts with 00 00, a type byte and a dimension count", hex(.found))]
    NotIdx {
        /// The file.
        path: PathBuf,
        /// Its first (up to) 4 bytes.
        found: Vec<u8>,
    },
    /// The type byte is not one of the six IDX types.
    #[error("{path}: unknown IDX element type byte 0x{code:02x} (known: 0x08 u8, 0x09 i8, 0x0b i16, 0x0c i32, 0x0d f32, 0x0e f64)")]
    UnknownType {
        /// The file.
        path: PathBuf,
        /// The type byte.
        code: u8,
    },
    /// The header declares zero dimensions.
    #[error("{path}: the IDX header declares zero dimensions")]
    ZeroDims {
        /// The file.
        path: PathBuf,
    },
    /// The file ends inside the dimension list.
    #[error("{path}: truncated IDX header: {ndims} dimensions need a {expected}-byte header, found {found} bytes")]
    TruncatedHeader {
        /// The file.
        path: PathBuf,
        /// The declared number of dimensions.
        ndims: u8,
        /// Header length the dimension count implies.
        expected: usize,
        /// Bytes actually present.
        found: usize,
    },
    /// The declared data size overflows or exceeds [`MAX_DATA_BYTES`].
    #[error("{path}: the IDX header declares {} elements of {elem} ({} bytes each): {}, more than the {}-byte (4 GiB) limit", dims_str(.dims), .elem.size(), size_str(*.bytes), MAX_DATA_BYTES)]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// The declared dimensions.
        dims: Vec<u32>,
        /// The element type.
        elem: IdxType,
        /// The declared data size in bytes; `None` when it overflows 64 bits.
        bytes: Option<u64>,
    },
    /// The file ends before the declared data does.
    #[error("{path}: truncated IDX data: expected {expected} data bytes, found {found}")]
    Truncated {
        /// The file.
        path: PathBuf,
        /// Data bytes the header declares.
        expected: u64,
        /// Data bytes present.
        found: u64,
    },
    /// Bytes follow the declared data.
    #[error("{path}: trailing data after the {declared} data bytes the header declares")]
    TrailingData {
        /// The file.
        path: PathBuf,
        /// Data bytes the header declares.
        declared: u64,
    },
    /// The array is not of the element type and dimension count the caller needs.
    #[error("{path}: expected {expected}, found {found} with {ndims} dimension{}", if *.ndims == 1 { "" } else { "s" })]
    WrongShape {
        /// The file.
        path: PathBuf,
        /// What was wanted, e.g. `an image file (u8, 3 dimensions)`.
        expected: &'static str,
        /// The file's element type.
        found: IdxType,
        /// The file's dimension count.
        ndims: usize,
    },
    /// An image file and a label file hold different numbers of examples.
    #[error("{images} holds {image_count} images but {labels} holds {label_count} labels")]
    CountMismatch {
        /// The image file.
        images: PathBuf,
        /// Its number of images.
        image_count: usize,
        /// The label file.
        labels: PathBuf,
        /// Its number of labels.
        label_count: usize,
    },
    /// [`find_mnist`] did not find some of the four files.
    #[error("{dir}: MNIST files missing, looked for: {}", .looked_for.join("; "))]
    MnistMissing {
        /// The directory searched.
        dir: PathBuf,
        /// For each missing file, the names tried, e.g. `train-labels-idx1-ubyte[.gz] or train-labels.idx1-ubyte[.gz]`.
        looked_for: Vec<String>,
    },
}

fn hex(bytes: &[u8]) -> String {
    if bytes.is_empty() {
        return "missing (the input is empty)".into();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(" ")
}

fn dims_str(dims: &[u32]) -> String {
    dims.iter().map(|d| d.to_string()).collect::<Vec<_>>().join("×")
}

fn size_str(bytes: Option<u64>) -> String {
    match bytes {
        Some(b) => format!("{b} bytes"),
        None => "a size that overflows 64 bits".into(),
    }
}

/// A checked header: element type, dimensions and the data size they imply.
struct Header {
    elem: IdxType,
    dims: Vec<usize>,
    data_len: usize,
}

/// Checks the 4-byte magic (`prefix` may be shorter when the input is); returns the element
/// type and the dimension count.
fn check_magic(prefix: &[u8], path: &Path) -> Result<(IdxType, u8), IdxError> {
    match *prefix {
        [0, 0, code, ndims] => {
            let elem = IdxType::from_code(code).ok_or_else(|| IdxError::UnknownType { path: path.into(), code })?;
            if ndims == 0 {
                return Err(IdxError::ZeroDims { path: path.into() });
            }
            Ok((elem, ndims))
        }
        _ => Err(IdxError::NotIdx { path: path.into(), found: prefix.iter().take(4).copied().collect() }),
    }
}

/// Checks the dimension list (`4 * ndims` bytes) against the size limit.
fn check_dims(raw: &[u8], elem: IdxType, path: &Path) -> Result<Header, IdxError> {
    let raw_dims: Vec<u32> = be_vec(raw, u32::from_be_bytes);
    let too_large = |bytes| IdxError::TooLarge { path: path.into(), dims: raw_dims.clone(), elem, bytes };
    let mut bytes = Some(elem.size() as u64);
    for &d in &raw_dims {
        bytes = bytes.and_then(|b| b.checked_mul(u64::from(d)));
    }
    let data_len = match bytes {
        Some(b) if b <= MAX_DATA_BYTES => usize::try_from(b).map_err(|_| too_large(bytes))?,
        _ => return Err(too_large(bytes)),
    };
    let mut dims = Vec::with_capacity(raw_dims.len());
    for &d in &raw_dims {
        dims.push(usize::try_from(d).map_err(|_| too_large(bytes))?);
    }
    Ok(Header { elem, dims, data_len })
}

/// Converts big-endian `N`-byte groups (`bytes.len()` a multiple of `N`) in one pass.
fn be_vec<T, const N: usize>(bytes: &[u8], from_be: fn([u8; N]) -> T) -> Vec<T> {
    bytes
        .chunks_exact(N)
        .map(|c| {
            let mut a = [0u8; N];
            a.copy_from_slice(c);
            from_be(a)
        })
        .collect()
}

/// Decodes elements (`data.len()` a multiple of the element size), copying.
fn decode(elem: IdxType, data: &[u8]) -> IdxData {
    match elem {
        IdxType::U8 => IdxData::U8(data.to_vec()),
        IdxType::I8 => IdxData::I8(data.iter().map(|&b| b as i8).collect()),
        IdxType::I16 => IdxData::I16(be_vec(data, i16::from_be_bytes)),
        IdxType::I32 => IdxData::I32(be_vec(data, i32::from_be_bytes)),
        IdxType::F32 => IdxData::F32(be_vec(data, f32::from_be_bytes)),
        IdxType::F64 => IdxData::F64(be_vec(data, f64::from_be_bytes)),
    }
}

/// Decodes elements taking the buffer: moved as is for u8.
fn decode_owned(elem: IdxType, data: Vec<u8>) -> IdxData {
    match elem {
        IdxType::U8 => IdxData::U8(data),
        _ => decode(elem, &data),
    }
}

/// Parses a whole IDX file held in memory (already decompressed; gzip bytes are rejected as
/// not IDX). Errors name the buffer [`MEMORY_NAME`].
///
/// # Errors
///
/// [`IdxError::NotIdx`], [`IdxError::UnknownType`], [`IdxError::ZeroDims`],
/// [`IdxError::TruncatedHeader`], [`IdxError::TooLarge`], [`IdxError::Truncated`] or
/// [`IdxError::TrailingData`] when `bytes` is not exactly one well-formed IDX array.
pub fn parse_idx(bytes: &[u8]) -> Result<IdxArray, IdxError> {
    parse_named(bytes, Path::new(MEMORY_NAME))
}

fn parse_named(bytes: &[u8], path: &Path) -> Result<IdxArray, IdxError> {
    let (elem, ndims) = check_magic(&bytes[..bytes.len().min(4)], path)?;
    let header_len = 4 + 4 * usize::from(ndims);
    let Some(raw) = bytes.get(4..header_len) else {
        return Err(IdxError::TruncatedHeader { path: path.into(), ndims, expected: header_len, found: bytes.len() });
    };
    let h = check_dims(raw, elem, path)?;
    let data = &bytes[header_len..];
    if data.len() < h.data_len {
        return Err(IdxError::Truncated { path: path.into(), expected: h.data_len as u64, found: data.len() as u64 });
    }
    if data.len() > h.data_len {
        return Err(IdxError::TrailingData { path: path.into(), declared: h.data_len as u64 });
    }
    Ok(IdxArray { dims: h.dims, data: decode(h.elem, data) })
}

/// Reads into `buf` until it is full or the input ends; returns the bytes read.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Reads one IDX file, plain or gzip (recognised by its first two bytes, `1f 8b`, not its
/// name).
///
/// At most the header, the declared data and one more byte are read (from the decompressor
/// for gzip), and the buffer reserved up front never exceeds what the file can really hold,
/// so a header declaring a huge size over a tiny body costs nothing.
///
/// # Errors
///
/// [`IdxError::Io`] when the file cannot be opened or read, [`IdxError::BadGzip`] for a
/// corrupt or cut-short gzip stream, and the format errors of [`parse_idx`], all naming `path`.
pub fn read_idx(path: &Path) -> Result<IdxArray, IdxError> {
    let io_err = |source| IdxError::Io { path: path.into(), source };
    let mut f = File::open(path).map_err(io_err)?;
    let file_len = f.metadata().map_err(io_err)?.len();
    let mut magic = [0u8; 2];
    let n = read_full(&mut f, &mut magic).map_err(io_err)?;
    f.seek(SeekFrom::Start(0)).map_err(io_err)?;
    if n == 2 && magic == [0x1f, 0x8b] {
        let cap = file_len.saturating_mul(MAX_DEFLATE_RATIO);
        read_stream(MultiGzDecoder::new(BufReader::with_capacity(1 << 16, f)), path, cap, true)
    } else {
        read_stream(f, path, file_len, false)
    }
}

/// Parses an IDX stream whose decompressed length is at most `max_len`.
fn read_stream(mut r: impl Read, path: &Path, max_len: u64, gz: bool) -> Result<IdxArray, IdxError> {
    let err = |source: io::Error| {
        // the decompressor reports a corrupt stream as invalid input/data and a cut-short
        // one as an unexpected end
        let bad_stream = matches!(source.kind(), io::ErrorKind::InvalidInput | io::ErrorKind::InvalidData | io::ErrorKind::UnexpectedEof);
        if gz && bad_stream {
            IdxError::BadGzip { path: path.into(), source }
        } else {
            IdxError::Io { path: path.into(), source }
        }
    };
    let mut prefix = [0u8; 4];
    let n = read_full(&mut r, &mut prefix).map_err(err)?;
    let (elem, ndims) = check_magic(&prefix[..n], path)?;
    let mut raw = vec![0u8; 4 * usize::from(ndims)];
    let n = read_full(&mut r, &mut raw).map_err(err)?;
    if n < raw.len() {
        return Err(IdxError::TruncatedHeader { path: path.into(), ndims, expected: 4 + raw.len(), found: 4 + n });
    }
    let h = check_dims(&raw, elem, path)?;
    let want = h.data_len as u64 + 1;
    // reserve no more than the input can hold, so a lying header allocates nothing large
    let cap = want.min(max_len.saturating_sub(4 + raw.len() as u64).saturating_add(1));
    let mut data = Vec::with_capacity(usize::try_from(cap).unwrap_or(0));
    r.take(want).read_to_end(&mut data).map_err(err)?;
    if data.len() < h.data_len {
        return Err(IdxError::Truncated { path: path.into(), expected: h.data_len as u64, found: data.len() as u64 });
    }
    if data.len() > h.data_len {
        return Err(IdxError::TrailingData { path: path.into(), declared: h.data_len as u64 });
    }
    Ok(IdxArray { dims: h.dims, data: decode_owned(h.elem, data) })
}

/// MNIST-style images: `count` images of `rows` × `cols` u8 pixels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Images {
    /// Number of images.
    pub count: usize,
    /// Rows per image.
    pub rows: usize,
    /// Columns per image.
    pub cols: usize,
    /// `count * rows * cols` pixels, image after image, each row-major.
    pub pixels: Vec<u8>,
}

impl Images {
    /// The pixels of image `i` (`rows * cols` bytes, row-major); `None` when `i >= count`.
    pub fn image(&self, i: usize) -> Option<&[u8]> {
        let n = self.rows * self.cols;
        if i >= self.count {
            return None;
        }
        self.pixels.get(i * n..(i + 1) * n)
    }
}

const IMAGES_SHAPE: &str = "an image file (u8, 3 dimensions)";
const LABELS_SHAPE: &str = "a label file (u8, 1 dimension)";

/// Reads an image file: a u8 IDX array of exactly 3 dimensions (count, rows, columns).
///
/// # Errors
///
/// Those of [`read_idx`], and [`IdxError::WrongShape`] for another element type or
/// dimension count.
pub fn read_images(path: &Path) -> Result<Images, IdxError> {
    let a = read_idx(path)?;
    match (a.data, a.dims.as_slice()) {
        (IdxData::U8(pixels), &[count, rows, cols]) => Ok(Images { count, rows, cols, pixels }),
        (data, dims) => Err(IdxError::WrongShape { path: path.into(), expected: IMAGES_SHAPE, found: data.idx_type(), ndims: dims.len() }),
    }
}

/// Reads a label file: a u8 IDX array of exactly 1 dimension.
///
/// # Errors
///
/// Those of [`read_idx`], and [`IdxError::WrongShape`] for another element type or
/// dimension count.
pub fn read_labels(path: &Path) -> Result<Vec<u8>, IdxError> {
    let a = read_idx(path)?;
    match (a.data, a.dims.len()) {
        (IdxData::U8(labels), 1) => Ok(labels),
        (data, ndims) => Err(IdxError::WrongShape { path: path.into(), expected: LABELS_SHAPE, found: data.idx_type(), ndims }),
    }
}

/// Images with one label each.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabeledImages {
    /// The images.
    pub images: Images,
    /// One label per image (`labels.len() == images.count`).
    pub labels: Vec<u8>,
}

/// Reads an image file and its label file, which must hold the same number of examples.
///
/// # Errors
///
/// Those of [`read_images`] and [`read_labels`], and [`IdxError::CountMismatch`] (naming
/// both files and both counts) when the counts differ.
pub fn read_labeled(images: &Path, labels: &Path) -> Result<LabeledImages, IdxError> {
    let imgs = read_images(images)?;
    let labs = read_labels(labels)?;
    if imgs.count != labs.len() {
        return Err(IdxError::CountMismatch {
            images: images.into(),
            image_count: imgs.count,
            labels: labels.into(),
            label_count: labs.len(),
        });
    }
    Ok(LabeledImages { images: imgs, labels: labs })
}

/// The four files of the MNIST distribution.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MnistFiles {
    /// `train-images-idx3-ubyte` (60,000 images).
    pub train_images: PathBuf,
    /// `train-labels-idx1-ubyte`.
    pub train_labels: PathBuf,
    /// `t10k-images-idx3-ubyte` (10,000 images).
    pub test_images: PathBuf,
    /// `t10k-labels-idx1-ubyte`.
    pub test_labels: PathBuf,
}

/// The names tried for one MNIST file, in order of preference.
fn mnist_candidates(stem: &str, kind: &str) -> [String; 4] {
    [format!("{stem}-{kind}-ubyte"), format!("{stem}-{kind}-ubyte.gz"), format!("{stem}.{kind}-ubyte"), format!("{stem}.{kind}-ubyte.gz")]
}

/// Finds the four MNIST files in `dir`. Each may be spelt `train-images-idx3-ubyte` or
/// `train-images.idx3-ubyte` (likewise `train-labels-idx1-ubyte`, `t10k-images-idx3-ubyte`,
/// `t10k-labels-idx1-ubyte`), with or without `.gz`; the first that exists is taken, in the
/// order dash, dash `.gz`, dot, dot `.gz`. Only existence is checked, not contents.
///
/// # Errors
///
/// [`IdxError::MnistMissing`], naming `dir` and the names looked for, when any of the four
/// is missing (a missing or unreadable `dir` included).
pub fn find_mnist(dir: &Path) -> Result<MnistFiles, IdxError> {
    let mut looked_for = Vec::new();
    let mut find = |stem: &str, kind: &str| {
        let names = mnist_candidates(stem, kind);
        let found = names.iter().map(|n| dir.join(n)).find(|p| p.is_file());
        if found.is_none() {
            looked_for.push(format!("{stem}-{kind}-ubyte[.gz] or {stem}.{kind}-ubyte[.gz]"));
        }
        found.unwrap_or_default()
    };
    let files = MnistFiles {
        train_images: find("train-images", "idx3"),
        train_labels: find("train-labels", "idx1"),
        test_images: find("t10k-images", "idx3"),
        test_labels: find("t10k-labels", "idx1"),
    };
    if looked_for.is_empty() {
        Ok(files)
    } else {
        Err(IdxError::MnistMissing { dir: dir.into(), looked_for })
    }
}

#[cfg(test)]
mod tests;
