//! Reading `train mf`'s model back from the servers: the test RMSE after each epoch and the
//! safetensors export. The test ratings are matched to the model's rows once.

use super::{ITEMS, ITEM_BIAS, USERS, USER_BIAS};
use anyhow::{Context, Result};
use downpour_core::keys::{scramble, unscramble};
use downpour_data::ratings::Ratings;
use downpour_worker::WorkerSession;
use std::collections::HashMap;
use std::path::Path;

/// The model's rows for the users and items of the training set (sorted scrambled keys) and
/// the test ratings as indices into them (`u32::MAX`: not in the training set).
pub(super) struct Model {
    k: usize,
    users: Vec<u64>,
    items: Vec<u64>,
    test_user: Vec<u32>,
    test_item: Vec<u32>,
    test_value: Vec<f32>,
    p: Vec<f32>,
    bu: Vec<f32>,
    q: Vec<f32>,
    bi: Vec<f32>,
}

fn keys(ids: &[u64]) -> Vec<u64> {
    let mut v: Vec<u64> = ids.iter().map(|&x| scramble(x)).collect();
    v.sort_unstable();
    v.dedup();
    v
}

impl Model {
    pub fn new(train: &Ratings, test: Option<&Ratings>, k: usize) -> Model {
        let (users, items) = (keys(&train.users), keys(&train.items));
        let find = |keys: &[u64], id: u64| keys.binary_search(&scramble(id)).map_or(u32::MAX, |i| i as u32);
        let empty = Ratings::default();
        let t = test.unwrap_or(&empty);
        Model {
            k,
            test_user: t.users.iter().map(|&u| find(&users, u)).collect(),
            test_item: t.items.iter().map(|&i| find(&items, i)).collect(),
            test_value: t.values.clone(),
            p: vec![0.0; users.len() * k],
            bu: vec![0.0; users.len()],
            q: vec![0.0; items.len() * k],
            bi: vec![0.0; items.len()],
            users,
            items,
        }
    }

    /// The distinct users and items of the training set.
    pub fn sizes(&self) -> (usize, usize) {
        (self.users.len(), self.items.len())
    }

    fn pull(&mut self, s: &mut WorkerSession) -> Result<()> {
        s.kv.pull_into(USERS, &self.users, &mut self.p)?;
        s.kv.pull_into(USER_BIAS, &self.users, &mut self.bu)?;
        s.kv.pull_into(ITEMS, &self.items, &mut self.q)?;
        s.kv.pull_into(ITEM_BIAS, &self.items, &mut self.bi)?;
        Ok(())
    }

    /// Test RMSE of the servers' model; predictions clipped to `[lo, hi]` (the training
    /// ratings' range); a user or item not in the training set contributes nothing (no
    /// factors, no bias), as in scikit-surprise.
    pub fn test_rmse(&mut self, s: &mut WorkerSession, mu: f32, (lo, hi): (f32, f32)) -> Result<f64> {
        self.pull(s)?;
        let k = self.k;
        let mut sq = 0f64;
        for i in 0..self.test_value.len() {
            let (u, v) = (self.test_user[i] as usize, self.test_item[i] as usize);
            let mut pred = mu + self.bu.get(u).copied().unwrap_or(0.0) + self.bi.get(v).copied().unwrap_or(0.0);
            if u < self.users.len() && v < self.items.len() {
                pred += self.p[u * k..(u + 1) * k].iter().zip(&self.q[v * k..(v + 1) * k]).map(|(x, y)| x * y).sum::<f32>();
            }
            let e = (pred.clamp(lo, hi) - self.test_value[i]) as f64;
            sq += e * e;
        }
        Ok((sq / self.test_value.len().max(1) as f64).sqrt())
    }

    /// Writes the servers' model as safetensors (`user_ids`, `user_factors`, `user_bias`,
    /// `item_ids`, `item_factors`, `item_bias`, `global_mean`; ids ascending).
    pub fn export(&mut self, s: &mut WorkerSession, path: &Path, mu: f32) -> Result<()> {
        use safetensors::tensor::{Dtype, TensorView};
        self.pull(s)?;
        let k = self.k;
        let side = |keys: &[u64], f: &[f32], b: &[f32]| {
            let mut order: Vec<(u64, usize)> = keys.iter().enumerate().map(|(j, &key)| (unscramble(key), j)).collect();
            order.sort_unstable();
            let ids: Vec<u8> = order.iter().flat_map(|o| o.0.to_le_bytes()).collect();
            let fs: Vec<u8> = order.iter().flat_map(|o| f[o.1 * k..(o.1 + 1) * k].iter().flat_map(|x| x.to_le_bytes())).collect();
            let bs: Vec<u8> = order.iter().flat_map(|o| b[o.1].to_le_bytes()).collect();
            (ids, fs, bs)
        };
        let (ui, uf, ub) = side(&self.users, &self.p, &self.bu);
        let (ii, if_, ib) = side(&self.items, &self.q, &self.bi);
        let (nu, ni) = (self.users.len(), self.items.len());
        let mean = mu.to_le_bytes().to_vec();
        let data = [
            ("user_ids", Dtype::U64, vec![nu], &ui),
            ("user_factors", Dtype::F32, vec![nu, k], &uf),
            ("user_bias", Dtype::F32, vec![nu], &ub),
            ("item_ids", Dtype::U64, vec![ni], &ii),
            ("item_factors", Dtype::F32, vec![ni, k], &if_),
            ("item_bias", Dtype::F32, vec![ni], &ib),
            ("global_mean", Dtype::F32, vec![1], &mean),
        ];
        let mut views = Vec::new();
        for (name, dt, shape, buf) in data {
            views.push((name, TensorView::new(dt, shape, buf).context("internal error: a model tensor's shape")?));
        }
        let meta = HashMap::from([("format".to_string(), "downpour-mf".to_string())]);
        safetensors::serialize_to_file(views, Some(meta), path).with_context(|| format!("cannot write {}", path.display()))?;
        Ok(())
    }
}
