//! Vector operations on the shards of dense tables (Sandblaster L-BFGS, DistBelief §2.4 in
//! `../shared/REFERENCE.md`): a driver that never holds the parameters sends a short
//! program of `dot`, `axpy`, `scale`, `copy` and `fill` instructions; every server runs it
//! on its own part of the named tables and returns one partial scalar per `dot`, which the
//! driver adds up. Tables used together must be dense with the same domain and value length,
//! so every server owns the same key range of each (they are co-partitioned).
//!
//! Instructions act on the stored values directly, not through the table's update rule.

use crate::proto;
use crate::{CoreError, Result};

/// At most this many instructions in one program.
pub const MAX_INSTRUCTIONS: usize = 256;

/// One vector instruction over table ids.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum VecInstr {
    /// Returns `Σ a_i · b_i` (a partial sum per server).
    Dot {
        /// First table.
        a: u32,
        /// Second table (may equal `a`).
        b: u32,
    },
    /// `y ← y + alpha · x`.
    Axpy {
        /// Destination.
        y: u32,
        /// Scale of `x`.
        alpha: f64,
        /// Source (may equal `y`).
        x: u32,
    },
    /// `x ← alpha · x`.
    Scale {
        /// Table.
        x: u32,
        /// Factor.
        alpha: f64,
    },
    /// `dst ← src`.
    Copy {
        /// Destination.
        dst: u32,
        /// Source.
        src: u32,
    },
    /// `x ← value` everywhere.
    Fill {
        /// Table.
        x: u32,
        /// Value.
        value: f64,
    },
}

impl VecInstr {
    /// The tables the instruction touches.
    pub fn tables(&self) -> [u32; 2] {
        match *self {
            VecInstr::Dot { a, b } => [a, b],
            VecInstr::Axpy { y, x, .. } => [y, x],
            VecInstr::Scale { x, .. } | VecInstr::Fill { x, .. } => [x, x],
            VecInstr::Copy { dst, src } => [dst, src],
        }
    }

    /// True for instructions that return a scalar.
    pub fn returns_scalar(&self) -> bool {
        matches!(self, VecInstr::Dot { .. })
    }

    /// The wire form.
    pub fn to_proto(&self) -> proto::VecInstr {
        let (kind, a, b, alpha) = match *self {
            VecInstr::Dot { a, b } => ("dot", a, b, 0.0),
            VecInstr::Axpy { y, alpha, x } => ("axpy", y, x, alpha),
            VecInstr::Scale { x, alpha } => ("scale", x, x, alpha),
            VecInstr::Copy { dst, src } => ("copy", dst, src, 0.0),
            VecInstr::Fill { x, value } => ("fill", x, x, value),
        };
        proto::VecInstr { kind: kind.into(), a, b, alpha }
    }

    /// Reads an instruction from its wire form.
    pub fn from_proto(p: &proto::VecInstr) -> Result<VecInstr> {
        if !p.alpha.is_finite() {
            return Err(CoreError::Malformed(format!("vector instruction {:?}: the scalar {} is not finite", p.kind, p.alpha)));
        }
        Ok(match p.kind.as_str() {
            "dot" => VecInstr::Dot { a: p.a, b: p.b },
            "axpy" => VecInstr::Axpy { y: p.a, alpha: p.alpha, x: p.b },
            "scale" => VecInstr::Scale { x: p.a, alpha: p.alpha },
            "copy" => VecInstr::Copy { dst: p.a, src: p.b },
            "fill" => VecInstr::Fill { x: p.a, value: p.alpha },
            k => return Err(CoreError::Malformed(format!("unknown vector instruction {k:?} (dot, axpy, scale, copy, fill)"))),
        })
    }
}

/// Encodes a program.
pub fn program_to_proto(instrs: &[VecInstr]) -> proto::VecProgram {
    proto::VecProgram { instrs: instrs.iter().map(VecInstr::to_proto).collect() }
}

/// Decodes and checks a program: at least one and at most [`MAX_INSTRUCTIONS`] instructions.
pub fn program_from_proto(p: &proto::VecProgram) -> Result<Vec<VecInstr>> {
    if p.instrs.is_empty() || p.instrs.len() > MAX_INSTRUCTIONS {
        return Err(CoreError::Malformed(format!(
            "a vector program has {} instructions; 1..={MAX_INSTRUCTIONS} are allowed",
            p.instrs.len()
        )));
    }
    p.instrs.iter().map(VecInstr::from_proto).collect()
}

/// The distinct tables a program touches, sorted (the order to lock them in).
pub fn program_tables(instrs: &[VecInstr]) -> Vec<u32> {
    let mut t: Vec<u32> = instrs.iter().flat_map(|i| i.tables()).collect();
    t.sort_unstable();
    t.dedup();
    t
}

/// Runs `instrs` over `vectors`, which holds one equally long slice per table of
/// [`program_tables`] in that order. Returns one value per `dot`, in program order.
/// Fails, changing nothing, when the slices differ in length or a table is missing.
pub fn execute(instrs: &[VecInstr], tables: &[u32], vectors: &mut [&mut [f32]]) -> Result<Vec<f64>> {
    if tables.len() != vectors.len() {
        return Err(CoreError::Malformed(format!("{} tables but {} vectors", tables.len(), vectors.len())));
    }
    if let Some(first) = vectors.first() {
        let n = first.len();
        if let Some((i, v)) = vectors.iter().enumerate().find(|(_, v)| v.len() != n) {
            return Err(CoreError::Malformed(format!(
                "vector operations need co-partitioned tables: table {} holds {} values here, table {} holds {n}",
                tables[i],
                v.len(),
                tables[0]
            )));
        }
    }
    let index = |t: u32| {
        tables.binary_search(&t).map_err(|_| CoreError::Malformed(format!("vector program names table {t}, which it was not given")))
    };
    for ins in instrs {
        for t in ins.tables() {
            index(t)?;
        }
    }
    let mut out = Vec::new();
    for ins in instrs {
        match *ins {
            VecInstr::Dot { a, b } => {
                let (ia, ib) = (index(a)?, index(b)?);
                let (va, vb) = (&*vectors[ia], &*vectors[ib]);
                out.push(dot(va, vb));
            }
            VecInstr::Axpy { y, alpha, x } => {
                let (iy, ix) = (index(y)?, index(x)?);
                if iy == ix {
                    let f = (1.0 + alpha) as f32;
                    vectors[iy].iter_mut().for_each(|v| *v *= f);
                } else {
                    let (dst, src) = pair(vectors, iy, ix);
                    let a = alpha as f32;
                    for (d, s) in dst.iter_mut().zip(src.iter()) {
                        *d += a * *s;
                    }
                }
            }
            VecInstr::Scale { x, alpha } => {
                let f = alpha as f32;
                vectors[index(x)?].iter_mut().for_each(|v| *v *= f);
            }
            VecInstr::Copy { dst, src } => {
                let (id, is) = (index(dst)?, index(src)?);
                if id != is {
                    let (d, s) = pair(vectors, id, is);
                    d.copy_from_slice(s);
                }
            }
            VecInstr::Fill { x, value } => {
                vectors[index(x)?].fill(value as f32);
            }
        }
    }
    Ok(out)
}

/// `Σ a_i b_i` accumulated in f64 over blocks of f32 products.
fn dot(a: &[f32], b: &[f32]) -> f64 {
    let mut total = 0f64;
    for (ca, cb) in a.chunks(1024).zip(b.chunks(1024)) {
        let mut acc = [0f32; 8];
        let (ea, eb) = (ca.chunks_exact(8), cb.chunks_exact(8));
        let (ra, rb) = (ea.remainder(), eb.remainder());
        for (x, y) in ea.zip(eb) {
            for k in 0..8 {
                acc[k] += x[k] * y[k];
            }
        }
        let mut s: f64 = acc.iter().map(|&v| v as f64).sum();
        s += ra.iter().zip(rb).map(|(x, y)| (*x as f64) * (*y as f64)).sum::<f64>();
        total += s;
    }
    total
}

/// A mutable slice and a shared one from two distinct indices.
fn pair<'a>(v: &'a mut [&mut [f32]], dst: usize, src: usize) -> (&'a mut [f32], &'a [f32]) {
    if dst < src {
        let (l, r) = v.split_at_mut(src);
        (&mut *l[dst], &*r[0])
    } else {
        let (l, r) = v.split_at_mut(dst);
        (&mut *r[0], &*l[src])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_run_in_order_and_return_one_scalar_per_dot() {
        let mut a = vec![1.0f32, 2.0, 3.0];
        let mut b = vec![4.0f32, 5.0, 6.0];
        let mut c = vec![0.0f32; 3];
        let prog = [
            VecInstr::Dot { a: 1, b: 2 },
            VecInstr::Copy { dst: 3, src: 1 },
            VecInstr::Axpy { y: 3, alpha: 2.0, x: 2 },
            VecInstr::Scale { x: 1, alpha: -1.0 },
            VecInstr::Dot { a: 3, b: 3 },
            VecInstr::Axpy { y: 2, alpha: 1.0, x: 2 },
            VecInstr::Fill { x: 1, value: 0.5 },
        ];
        let tables = program_tables(&prog);
        assert_eq!(tables, vec![1, 2, 3]);
        let out = execute(&prog, &tables, &mut [&mut a, &mut b, &mut c]).unwrap();
        assert_eq!(c, vec![9.0, 12.0, 15.0]);
        assert_eq!(out, vec![32.0, 81.0 + 144.0 + 225.0]);
        assert_eq!(b, vec![8.0, 10.0, 12.0]);
        assert_eq!(a, vec![0.5; 3]);
    }

    #[test]
    fn mismatched_or_missing_tables_change_nothing() {
        let mut a = vec![1.0f32, 2.0];
        let mut b = vec![1.0f32];
        let prog = [VecInstr::Scale { x: 1, alpha: 3.0 }, VecInstr::Copy { dst: 1, src: 2 }];
        assert!(execute(&prog, &[1, 2], &mut [&mut a, &mut b]).is_err());
        assert!(execute(&[VecInstr::Scale { x: 1, alpha: 3.0 }, VecInstr::Dot { a: 1, b: 9 }], &[1], &mut [&mut a]).is_err());
        assert_eq!(a, vec![1.0, 2.0]);
    }

    #[test]
    fn wire_form_round_trips_and_bad_programs_are_refused() {
        let prog = vec![
            VecInstr::Dot { a: 1, b: 2 },
            VecInstr::Axpy { y: 3, alpha: -0.25, x: 4 },
            VecInstr::Scale { x: 5, alpha: 2.0 },
            VecInstr::Copy { dst: 6, src: 7 },
            VecInstr::Fill { x: 8, value: 1.5 },
        ];
        assert_eq!(program_from_proto(&program_to_proto(&prog)).unwrap(), prog);
        assert!(program_from_proto(&proto::VecProgram::default()).is_err());
        let bad = proto::VecProgram { instrs: vec![proto::VecInstr { kind: "sqrt".into(), ..Default::default() }] };
        assert!(program_from_proto(&bad).is_err());
        let nan = proto::VecProgram { instrs: vec![proto::VecInstr { kind: "scale".into(), alpha: f64::NAN, ..Default::default() }] };
        assert!(program_from_proto(&nan).is_err());
    }

    #[test]
    fn sharded_execution_sums_to_the_local_result() {
        // two "servers" each run the program on their half; the dots add up
        let x: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.37).sin()).collect();
        let y: Vec<f32> = (0..1000).map(|i| (i as f32 * 0.11).cos()).collect();
        let prog = [VecInstr::Axpy { y: 2, alpha: 0.5, x: 1 }, VecInstr::Dot { a: 1, b: 2 }];
        let (mut lx, mut ly) = (x.clone(), y.clone());
        let whole = execute(&prog, &[1, 2], &mut [&mut lx, &mut ly]).unwrap()[0];
        let mut sum = 0.0;
        let (mut sx, mut sy) = (x.clone(), y.clone());
        let (x0, x1) = sx.split_at_mut(400);
        let (y0, y1) = sy.split_at_mut(400);
        sum += execute(&prog, &[1, 2], &mut [x0, y0]).unwrap()[0];
        sum += execute(&prog, &[1, 2], &mut [x1, y1]).unwrap()[0];
        // f32 products summed in 8 lanes per block: the split changes only rounding
        assert!((whole - sum).abs() < 1e-5 * whole.abs().max(1.0), "{whole} vs {sum}");
        assert_eq!(sy, ly);
    }
}
