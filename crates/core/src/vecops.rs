//! Vector operations on the shards of dense tables (Sandblaster L-BFGS, DistBelief §2.4 in
//! `../shared/REFERENCE.md`): a driver that never holds the parameters sends a short
//! program of `dot`, `axpy`, `scale`, `copy` and `fill` instructions; every server runs it
//! on its own part of the named tables and returns one partial scalar per `dot`, which the
//! driver adds up. Tables used together must be dense with the same domain and value length,
//! so every server owns the same key range of each (they are co-partitioned).
//!
//! Instructions act on the stored values directly, not through the table's update rule.
//!
//! Four more serve OWL-QN (L1-regularised L-BFGS, Andrew & Gao 2007): the pseudo-gradient,
//! the projection of a direction onto the pseudo-gradient's descent signs, the step
//! projected onto an orthant, and a weighted L1 norm.

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
    /// The pseudo-gradient of `f(w) + Σ λ_i |w_i|` from the gradient `g` of f:
    /// `dst_i = g_i + λ_i sign(w_i)` where `w_i ≠ 0`; where `w_i = 0`, `g_i + λ_i` if that is
    /// negative, `g_i − λ_i` if that is positive, else 0. `dst` must differ from the others.
    PseudoGradient {
        /// Destination.
        dst: u32,
        /// Gradient of the smooth part.
        g: u32,
        /// Parameters.
        w: u32,
        /// Per-coordinate L1 strengths λ.
        l1: u32,
    },
    /// `d_i ← 0` wherever `d_i · pg_i ≥ 0` (the direction keeps only coordinates that descend
    /// along −pg).
    ProjectDirection {
        /// Direction, changed in place.
        d: u32,
        /// Pseudo-gradient.
        pg: u32,
    },
    /// `w ← π(base + alpha · d)`: the step, with every coordinate that leaves the orthant
    /// `ξ_i = sign(base_i)` (or `sign(−pg_i)` where `base_i = 0`) set to 0. `w` must differ
    /// from the others.
    OrthantStep {
        /// Destination.
        w: u32,
        /// Start point.
        base: u32,
        /// Direction.
        d: u32,
        /// Pseudo-gradient at `base`.
        pg: u32,
        /// Step length.
        alpha: f64,
    },
    /// Returns `Σ weights_i · |x_i|` (a partial sum per server).
    WeightedNorm1 {
        /// Vector.
        x: u32,
        /// Per-coordinate weights.
        weights: u32,
    },
}

impl VecInstr {
    /// The tables the instruction touches (repeated to fill the array).
    pub fn tables(&self) -> [u32; 4] {
        match *self {
            VecInstr::Dot { a, b } => [a, b, b, b],
            VecInstr::Axpy { y, x, .. } => [y, x, x, x],
            VecInstr::Scale { x, .. } | VecInstr::Fill { x, .. } => [x; 4],
            VecInstr::Copy { dst, src } => [dst, src, src, src],
            VecInstr::PseudoGradient { dst, g, w, l1 } => [dst, g, w, l1],
            VecInstr::ProjectDirection { d, pg } => [d, pg, pg, pg],
            VecInstr::OrthantStep { w, base, d, pg, .. } => [w, base, d, pg],
            VecInstr::WeightedNorm1 { x, weights } => [x, weights, weights, weights],
        }
    }

    /// True for instructions that return a scalar.
    pub fn returns_scalar(&self) -> bool {
        matches!(self, VecInstr::Dot { .. } | VecInstr::WeightedNorm1 { .. })
    }

    /// The wire form.
    pub fn to_proto(&self) -> proto::VecInstr {
        let (kind, [a, b, c, d], alpha) = match *self {
            VecInstr::Dot { .. } => ("dot", self.tables(), 0.0),
            VecInstr::Axpy { alpha, .. } => ("axpy", self.tables(), alpha),
            VecInstr::Scale { alpha, .. } => ("scale", self.tables(), alpha),
            VecInstr::Copy { .. } => ("copy", self.tables(), 0.0),
            VecInstr::Fill { value, .. } => ("fill", self.tables(), value),
            VecInstr::PseudoGradient { .. } => ("pseudo_gradient", self.tables(), 0.0),
            VecInstr::ProjectDirection { .. } => ("project_direction", self.tables(), 0.0),
            VecInstr::OrthantStep { alpha, .. } => ("orthant_step", self.tables(), alpha),
            VecInstr::WeightedNorm1 { .. } => ("weighted_norm1", self.tables(), 0.0),
        };
        proto::VecInstr { kind: kind.into(), a, b, alpha, c, d }
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
            "pseudo_gradient" => VecInstr::PseudoGradient { dst: p.a, g: p.b, w: p.c, l1: p.d },
            "project_direction" => VecInstr::ProjectDirection { d: p.a, pg: p.b },
            "orthant_step" => VecInstr::OrthantStep { w: p.a, base: p.b, d: p.c, pg: p.d, alpha: p.alpha },
            "weighted_norm1" => VecInstr::WeightedNorm1 { x: p.a, weights: p.b },
            k => {
                return Err(CoreError::Malformed(format!(
                    "unknown vector instruction {k:?} (dot, axpy, scale, copy, fill, pseudo_gradient, project_direction, orthant_step, weighted_norm1)"
                )))
            }
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
        // the instructions that write one table while reading three need it distinct
        let distinct = |dst: u32, srcs: [u32; 3]| {
            if srcs.contains(&dst) {
                Err(CoreError::Malformed(format!("vector instruction {ins:?}: its destination table {dst} is also one it reads")))
            } else {
                Ok(())
            }
        };
        match *ins {
            VecInstr::PseudoGradient { dst, g, w, l1 } => distinct(dst, [g, w, l1])?,
            VecInstr::OrthantStep { w, base, d, pg, .. } => distinct(w, [base, d, pg])?,
            _ => {}
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
            VecInstr::PseudoGradient { dst, g, w, l1 } => {
                let id = index(dst)?;
                let out_v = std::mem::take(&mut vectors[id]);
                let (g, w, l1) = (&*vectors[index(g)?], &*vectors[index(w)?], &*vectors[index(l1)?]);
                for (((o, &g), &w), &l) in out_v.iter_mut().zip(g).zip(w).zip(l1) {
                    *o = pseudo_gradient(g, w, l);
                }
                vectors[id] = out_v;
            }
            VecInstr::ProjectDirection { d, pg } => {
                let (id, ip) = (index(d)?, index(pg)?);
                if id == ip {
                    // d · d ≥ 0 everywhere
                    vectors[id].fill(0.0);
                } else {
                    let (d, pg) = pair(vectors, id, ip);
                    for (d, &p) in d.iter_mut().zip(pg) {
                        if *d * p >= 0.0 {
                            *d = 0.0;
                        }
                    }
                }
            }
            VecInstr::OrthantStep { w, base, d, pg, alpha } => {
                let iw = index(w)?;
                let out_v = std::mem::take(&mut vectors[iw]);
                let (b, d, pg) = (&*vectors[index(base)?], &*vectors[index(d)?], &*vectors[index(pg)?]);
                let a = alpha as f32;
                for (((o, &b), &d), &p) in out_v.iter_mut().zip(b).zip(d).zip(pg) {
                    let x = b + a * d;
                    let orthant = if b != 0.0 { b } else { -p };
                    *o = if x * orthant > 0.0 { x } else { 0.0 };
                }
                vectors[iw] = out_v;
            }
            VecInstr::WeightedNorm1 { x, weights } => {
                let (x, wt) = (&*vectors[index(x)?], &*vectors[index(weights)?]);
                out.push(x.iter().zip(wt).map(|(&x, &w)| (x.abs() * w) as f64).sum());
            }
        }
    }
    Ok(out)
}

/// One coordinate of the pseudo-gradient of `f + λ|w|` (see [`VecInstr::PseudoGradient`]).
#[inline]
pub fn pseudo_gradient(g: f32, w: f32, l1: f32) -> f32 {
    if w > 0.0 {
        g + l1
    } else if w < 0.0 {
        g - l1
    } else if g + l1 < 0.0 {
        g + l1
    } else if g - l1 > 0.0 {
        g - l1
    } else {
        0.0
    }
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
    fn owlqn_instructions_match_their_definitions() {
        // tables: 1 dst, 2 g, 3 w, 4 λ, 5 d
        let mut dst = vec![9.0f32; 6];
        let mut g = vec![0.5f32, 0.5, -2.0, 2.0, 0.3, -0.3];
        let mut w = vec![1.0f32, -1.0, 0.0, 0.0, 0.0, 0.0];
        let mut l1 = vec![1.0f32; 6];
        let mut d = vec![-1.0f32, 1.0, 1.0, 1.0, 1.0, 1.0];
        let prog = [
            VecInstr::PseudoGradient { dst: 1, g: 2, w: 3, l1: 4 },
            VecInstr::ProjectDirection { d: 5, pg: 1 },
            VecInstr::WeightedNorm1 { x: 3, weights: 4 },
        ];
        let out = execute(&prog, &[1, 2, 3, 4, 5], &mut [&mut dst, &mut g, &mut w, &mut l1, &mut d]).unwrap();
        // w>0: g+λ; w<0: g−λ; w=0: g+λ<0 → g+λ; g−λ>0 → g−λ; else 0
        assert_eq!(dst, vec![1.5, -0.5, -1.0, 1.0, 0.0, 0.0]);
        // d keeps only coordinates with d·pg < 0
        assert_eq!(d, vec![-1.0, 1.0, 1.0, 0.0, 0.0, 0.0]);
        assert_eq!(out, vec![2.0]);
        // the step from base w along d, coordinates leaving the orthant set to 0:
        // ξ = (+, −, +(−pg), −(−pg), 0, 0)
        let mut to = vec![7.0f32; 6];
        let mut dir = vec![-2.0f32, 0.5, 1.0, 1.0, 1.0, -1.0];
        let prog = [VecInstr::OrthantStep { w: 6, base: 3, d: 5, pg: 1, alpha: 1.0 }];
        execute(&prog, &[1, 3, 5, 6], &mut [&mut dst, &mut w, &mut dir, &mut to]).unwrap();
        assert_eq!(to, vec![0.0, -0.5, 1.0, 0.0, 0.0, 0.0]);
        // a destination that is also read is refused, changing nothing
        let bad = [VecInstr::OrthantStep { w: 3, base: 3, d: 5, pg: 1, alpha: 1.0 }];
        assert!(execute(&bad, &[1, 3, 5], &mut [&mut dst, &mut w, &mut dir]).is_err());
        assert_eq!(w, vec![1.0, -1.0, 0.0, 0.0, 0.0, 0.0]);
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
            VecInstr::PseudoGradient { dst: 1, g: 2, w: 3, l1: 4 },
            VecInstr::ProjectDirection { d: 5, pg: 6 },
            VecInstr::OrthantStep { w: 7, base: 8, d: 9, pg: 10, alpha: 0.5 },
            VecInstr::WeightedNorm1 { x: 11, weights: 12 },
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
