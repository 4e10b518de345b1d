//! How feature values are transformed before training (`train linear --scale`): divided by
//! one number, by each feature's own largest |value|, or standardised, with statistics taken
//! from the first examples of the training input. A model learnt on the transformed values
//! maps back to one on the original values ([`Scaling::raw_weight`],
//! [`Scaling::intercept_shift`]), so exported models take the original files.

use crate::libsvm::DataError;
use crate::{Example, ExampleReader, Format};
use std::collections::HashMap;
use std::path::Path;

/// Each feature's largest |value| among the first `n` examples of `path` (features seen
/// there only).
pub fn feature_maxima(path: &Path, format: &Format, n: usize) -> Result<HashMap<u64, f32>, DataError> {
    let mut max: HashMap<u64, f32> = Default::default();
    for_first(path, format, n, |ex| {
        for (k, v) in ex.keys.iter().zip(&ex.values) {
            let m = max.entry(*k).or_insert(0.0);
            *m = m.max(v.abs());
        }
    })?;
    Ok(max)
}

/// One feature's statistics over a sample of examples (absent = 0, as in the file).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FeatureMoments {
    /// Examples in which the feature is present.
    pub present: usize,
    /// Sum of its values.
    pub sum: f64,
    /// Sum of its squared values.
    pub sum_sq: f64,
    /// Largest |value|.
    pub max_abs: f64,
}

/// The number of examples read (at most `n`) and each feature's [`FeatureMoments`] over the
/// first `n` examples of `path`.
pub fn feature_moments(path: &Path, format: &Format, n: usize) -> Result<(usize, HashMap<u64, FeatureMoments>), DataError> {
    let mut m: HashMap<u64, FeatureMoments> = Default::default();
    let examples = for_first(path, format, n, |ex| {
        for (k, v) in ex.keys.iter().zip(&ex.values) {
            let f = m.entry(*k).or_default();
            let v = f64::from(*v);
            f.present += 1;
            f.sum += v;
            f.sum_sq += v * v;
            f.max_abs = f.max_abs.max(v.abs());
        }
    })?;
    Ok((examples, m))
}

/// Calls `f` on each of the first `n` examples of `path`; returns how many there were.
fn for_first(path: &Path, format: &Format, n: usize, mut f: impl FnMut(&Example)) -> Result<usize, DataError> {
    let mut r = ExampleReader::open(path, format)?;
    let mut ex = Example::default();
    let mut seen = 0;
    while seen < n && r.next_into(&mut ex)? {
        f(&ex);
        seen += 1;
    }
    Ok(seen)
}

/// The fraction of a sample's non-zero values that lie in dense features (present in at
/// least half of the `examples` examples): near 1 for a tabular file whose columns every row
/// fills, low for hashed text or one-hot categories.
pub fn dense_fraction(examples: usize, moments: &HashMap<u64, FeatureMoments>) -> f64 {
    let (mut dense, mut all) = (0usize, 0usize);
    for f in moments.values() {
        all += f.present;
        if f.present * 2 >= examples {
            dense += f.present;
        }
    }
    if all == 0 {
        0.0
    } else {
        dense as f64 / all as f64
    }
}

/// A centred feature of a [`Scaling`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Centred {
    /// The feature id (as in the file).
    pub id: u64,
    /// Its mean in the original units, subtracted before the divisor.
    pub mean: f32,
    /// `mean` divided by the feature's divisor: what is subtracted from the divided value,
    /// and the value an example without the feature gets (negated).
    shift: f32,
}

/// How feature values are transformed before training: each divided by one number for every
/// feature and by its own number (features not listed: 1), and the centred features' means
/// subtracted first, so `x' = (x − mean) / divisor`. Centring gives every example every
/// centred feature (an absent one is a 0 in the original units, so `−mean / divisor`).
#[derive(Clone, Debug, PartialEq)]
pub struct Scaling {
    /// Every value is divided by this (1: unchanged).
    pub all: f32,
    /// Feature id → its own divisor (features not listed: 1).
    pub per_feature: HashMap<u64, f32>,
    /// Centred features, in id order.
    centre: Vec<Centred>,
    /// Feature id → its position in `centre`.
    centre_at: HashMap<u64, usize>,
}

impl Default for Scaling {
    fn default() -> Self {
        Scaling { all: 1.0, per_feature: Default::default(), centre: Vec::new(), centre_at: Default::default() }
    }
}

impl Scaling {
    /// Every value divided by `all` (> 0).
    pub fn all(all: f32) -> Scaling {
        Scaling { all, ..Default::default() }
    }

    /// Each feature whose largest |value| among the first `n` examples of `path` exceeds 1
    /// divided by that value (a count in the thousands and a ratio below 1 both end up in
    /// [−1, 1]); features within [−1, 1] there, or not seen there, unchanged.
    pub fn per_feature_max(path: &Path, format: &Format, n: usize) -> Result<Scaling, DataError> {
        Ok(Scaling::from_maxima(feature_maxima(path, format, n)?))
    }

    /// [`Scaling::per_feature_max`] from the maxima [`feature_maxima`] found.
    pub fn from_maxima(mut max: HashMap<u64, f32>) -> Scaling {
        max.retain(|_, m| *m > 1.0 && m.is_finite());
        Scaling { all: 1.0, per_feature: max, ..Default::default() }
    }

    /// Standardisation from the first `n` examples of `path`: see [`Scaling::from_moments`].
    pub fn standardize(path: &Path, format: &Format, n: usize) -> Result<Scaling, DataError> {
        let (examples, m) = feature_moments(path, format, n)?;
        Ok(Scaling::from_moments(examples, &m))
    }

    /// Standardisation from the statistics of a sample of `examples` examples: each dense
    /// feature (present in at least half of them; the columns of a tabular file) becomes
    /// `(x − mean) / standard deviation` (a constant one: `x − mean`, so 0); every other
    /// feature (sparse ones, such as hashed text or one-hot categories, whose standard
    /// deviation is tiny and would blow rare values up) is divided by its largest |value|
    /// when that exceeds 1, as [`Scaling::per_feature_max`].
    pub fn from_moments(examples: usize, moments: &HashMap<u64, FeatureMoments>) -> Scaling {
        let mut s = Scaling::all(1.0);
        let n = examples.max(1) as f64;
        for (&id, f) in moments {
            if f.present * 2 >= examples && examples > 0 {
                let mean = f.sum / n;
                let var = (f.sum_sq / n - mean * mean).max(0.0);
                let sd = var.sqrt();
                let sd = if sd.is_finite() && sd > 1e-9 * mean.abs().max(1.0) { sd as f32 } else { 1.0 };
                if sd != 1.0 {
                    s.per_feature.insert(id, sd);
                }
                if mean != 0.0 && mean.is_finite() {
                    s.centre.push(Centred { id, mean: mean as f32, shift: 0.0 });
                }
            } else if f.max_abs > 1.0 && f.max_abs.is_finite() {
                s.per_feature.insert(id, f.max_abs as f32);
            }
        }
        s.centre.sort_unstable_by_key(|c| c.id);
        for i in 0..s.centre.len() {
            let c = s.centre[i];
            s.centre[i].shift = c.mean / s.divisor(c.id);
            s.centre_at.insert(c.id, i);
        }
        s
    }

    /// The largest per-feature divisor (1 when none is listed): with [`Scaling::per_feature_max`],
    /// the largest |value| of the examples looked at, when above 1.
    pub fn largest(&self) -> f32 {
        self.per_feature.values().fold(1f32, |m, v| m.max(*v))
    }

    /// What feature `id`'s values are divided by.
    pub fn divisor(&self, id: u64) -> f32 {
        self.all * self.per_feature.get(&id).copied().unwrap_or(1.0)
    }

    /// What the transform does, in a word: `none`, `divide` (one number), `per-feature`
    /// (features' own divisors) or `standardize` (some features centred).
    pub fn kind(&self) -> &'static str {
        if !self.centre.is_empty() {
            "standardize"
        } else if !self.per_feature.is_empty() {
            "per-feature"
        } else if self.all != 1.0 {
            "divide"
        } else {
            "none"
        }
    }

    /// The centred features, in id order.
    pub fn centred(&self) -> &[Centred] {
        &self.centre
    }

    /// Nothing is changed.
    pub fn is_identity(&self) -> bool {
        self.all == 1.0 && self.per_feature.is_empty() && self.centre.is_empty()
    }

    /// Transforms one example's values (of features `keys`, ids as in the file), appending
    /// the centred features it lacks. `seen` is scratch the caller keeps between calls (no
    /// allocation per example). An id repeated within the example is centred at each.
    pub fn apply(&self, keys: &mut Vec<u64>, values: &mut Vec<f32>, seen: &mut Vec<bool>) {
        if self.all != 1.0 {
            let f = 1.0 / self.all;
            values.iter_mut().for_each(|v| *v *= f);
        }
        if !self.per_feature.is_empty() {
            for (k, v) in keys.iter().zip(values.iter_mut()) {
                if let Some(d) = self.per_feature.get(k) {
                    *v /= d;
                }
            }
        }
        if !self.centre.is_empty() {
            seen.clear();
            seen.resize(self.centre.len(), false);
            for (k, v) in keys.iter().zip(values.iter_mut()) {
                if let Some(&i) = self.centre_at.get(k) {
                    seen[i] = true;
                    *v -= self.centre[i].shift;
                }
            }
            for (c, seen) in self.centre.iter().zip(seen.iter()) {
                if !seen {
                    keys.push(c.id);
                    values.push(-c.shift);
                }
            }
        }
    }

    /// Feature `id`'s weight on the original values, for weight `w` on the transformed ones.
    pub fn raw_weight(&self, id: u64, w: f32) -> f32 {
        w / self.divisor(id)
    }

    /// A model's `(feature id, weight on the transformed values)` pairs turned into the same
    /// model on the original values: each weight divided by its feature's divisor, and the
    /// centring folded into the intercept (the weight of [`crate::BIAS_ID`], added when
    /// absent and the shift is not 0). Order is kept; an added intercept goes last.
    pub fn to_original(&self, pairs: &mut Vec<(u64, f32)>) {
        let shift = if self.centre.is_empty() {
            0.0
        } else {
            let by_id: HashMap<u64, f32> = pairs.iter().copied().collect();
            self.intercept_shift(|id| by_id.get(&id).copied().unwrap_or(0.0))
        };
        for (id, w) in pairs.iter_mut() {
            *w = self.raw_weight(*id, *w);
        }
        if shift != 0.0 {
            match pairs.iter_mut().find(|(id, _)| *id == crate::BIAS_ID) {
                Some((_, b)) => *b += shift,
                None => pairs.push((crate::BIAS_ID, shift)),
            }
        }
    }

    /// What the centring adds to the intercept of the model on the original values, given
    /// each feature's weight on the transformed ones: `−Σ w_c · mean_c / divisor_c` over the
    /// centred features (0 when none are).
    pub fn intercept_shift(&self, weight: impl Fn(u64) -> f32) -> f32 {
        -self.centre.iter().map(|c| f64::from(weight(c.id)) * f64::from(c.shift)).sum::<f64>() as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::share::ShareReader;

    #[test]
    fn per_feature_scaling_brings_each_large_feature_into_unit_range_and_leaves_small_ones() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("t.svm");
        std::fs::write(&p, "1 1:2500 2:0.5 3:-8\n0 1:1000 2:0.25\n1 1:40 4:1\n").unwrap();
        let sc = Scaling::per_feature_max(&p, &Format::Libsvm(Default::default()), 10).unwrap();
        assert_eq!(sc.divisor(1), 2500.0);
        assert_eq!(sc.divisor(3), 8.0);
        assert_eq!((sc.divisor(2), sc.divisor(4), sc.divisor(99)), (1.0, 1.0, 1.0), "small, unit and unseen features stay");
        let mut r = ShareReader::for_worker(std::slice::from_ref(&p), &Format::Libsvm(Default::default()), 0, 1)
            .unwrap()
            .with_scaling(std::sync::Arc::new(sc));
        let b = r.next_batch(10).unwrap().unwrap();
        assert!(b.values.iter().all(|v| v.abs() <= 1.0), "{:?}", b.values);
        assert!(b.values.contains(&0.5) && b.values.contains(&-1.0) && b.values.contains(&0.4), "{:?}", b.values);
        // only the first n examples are looked at
        let first = Scaling::per_feature_max(&p, &Format::Libsvm(Default::default()), 1).unwrap();
        assert_eq!(first.divisor(1), 2500.0);
        assert_eq!(Scaling::all(4.0).divisor(7), 4.0);
    }

    #[test]
    fn standardize_centres_dense_columns_and_the_model_maps_back_to_the_original_values() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("t.svm");
        // Feature 1 dense (in all 4), 2 dense (in 2 of 4: absent = 0), 3 sparse (1 of 4).
        std::fs::write(&p, "1 1:1000 2:2 3:50\n0 1:3000 2:4\n1 1:2000\n0 1:2000\n").unwrap();
        let fmt = Format::Libsvm(Default::default());
        let sc = Scaling::standardize(&p, &fmt, 100).unwrap();
        // feature 1: mean 2000, sd sqrt(500,000); feature 2: mean 1.5, sd sqrt(5 - 2.25)
        assert!((sc.divisor(1) - 500_000f32.sqrt()).abs() < 1e-2, "{}", sc.divisor(1));
        assert!((sc.divisor(2) - 2.75f32.sqrt()).abs() < 1e-5, "{}", sc.divisor(2));
        assert_eq!(sc.divisor(3), 50.0, "sparse features are divided by their largest value");
        assert_eq!(sc.centred().iter().map(|c| c.id).collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!((sc.kind(), Scaling::all(1.0).kind(), Scaling::all(2.0).kind()), ("standardize", "none", "divide"));
        let mut r = ShareReader::for_worker(std::slice::from_ref(&p), &fmt, 0, 1).unwrap().with_scaling(std::sync::Arc::new(sc.clone()));
        let mut cols: HashMap<u64, Vec<f32>> = HashMap::new();
        while let Some(ex) = r.next_example().unwrap() {
            assert!(ex.keys.contains(&1) && ex.keys.contains(&2), "every example gets every centred feature: {ex:?}");
            for (k, v) in ex.keys.iter().zip(&ex.values) {
                cols.entry(*k).or_default().push(*v);
            }
        }
        for id in [1, 2] {
            let c = &cols[&id];
            let mean = c.iter().sum::<f32>() / 4.0;
            let var = c.iter().map(|v| v * v).sum::<f32>() / 4.0 - mean * mean;
            assert!(mean.abs() < 1e-5 && (var - 1.0).abs() < 1e-4, "feature {id}: mean {mean}, variance {var}");
        }
        assert_eq!(cols[&3], vec![1.0]);
        // A model on the transformed values scores every example as its raw-unit form does.
        let w = |id: u64| match id {
            1 => 0.7,
            2 => -1.3,
            3 => 0.4,
            _ => 0.0,
        };
        let b = 0.2f32;
        let mut model = vec![(3, w(3)), (1, w(1)), (2, w(2)), (crate::BIAS_ID, b)];
        sc.to_original(&mut model);
        let raw = |id: u64| model.iter().find(|p| p.0 == id).map_or(0.0, |p| p.1);
        assert_eq!(raw(3), 0.4 / 50.0);
        let raw_b = raw(crate::BIAS_ID);
        let mut r = ShareReader::for_worker(std::slice::from_ref(&p), &fmt, 0, 1).unwrap().with_scaling(std::sync::Arc::new(sc.clone()));
        let mut orig = crate::ExampleReader::open(&p, &fmt).unwrap();
        let mut ex = Example::default();
        while let Some(t) = r.next_example().unwrap() {
            assert!(orig.next_into(&mut ex).unwrap());
            let transformed: f32 = b + t.keys.iter().zip(&t.values).map(|(k, v)| w(*k) * v).sum::<f32>();
            let original: f32 = raw_b + ex.keys.iter().zip(&ex.values).map(|(k, v)| raw(*k) * v).sum::<f32>();
            assert!((transformed - original).abs() < 1e-4, "{transformed} vs {original}");
        }
        // without an intercept in the model, the centring adds one
        let mut model = vec![(1, w(1)), (2, w(2))];
        sc.to_original(&mut model);
        assert_eq!(model.last().map(|p| p.0), Some(crate::BIAS_ID));
        let (_, m) = feature_moments(&p, &fmt, 100).unwrap();
        assert_eq!(dense_fraction(4, &m), 6.0 / 7.0);
    }
}
