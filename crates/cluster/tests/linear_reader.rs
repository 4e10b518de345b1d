//! `train linear --reader inline` (minibatches read on the training thread) trains the same
//! model as `--reader thread` (a reader thread ahead of it): same minibatches, same requests
//! in the same order.

use downpour_cluster::{run_embedded, Settings};
use downpour_jobs::linear::{InputConfig, InputFormat, LinearConfig, ReaderMode};
use downpour_jobs::{Collector, Job, TrainModel};

fn train(reader: ReaderMode) -> serde_json::Value {
    let data = concat!(env!("CARGO_MANIFEST_DIR"), "/../../data/spamassassin");
    let cfg = LinearConfig {
        train: vec![format!("{data}/train.jsonl.gz").into()],
        test: Some(format!("{data}/test.jsonl.gz").into()),
        input: InputConfig { format: InputFormat::TextJsonl, ..Default::default() },
        lr: 1.0,
        batch: 10,
        epochs: Some(2), // (the streaming learner: files this small would go to L-BFGS)
        reader,
        quiet: true,
        ..Default::default()
    };
    let report = Collector::new();
    run_embedded(&Settings::default(), 1, 1, &Job::Train(TrainModel::Linear(Box::new(cfg))), report.clone()).unwrap();
    report.metrics_of("linear").unwrap()
}

#[test]
fn reading_inline_trains_the_same_model_as_a_reader_thread() {
    let (t, i) = (train(ReaderMode::Thread), train(ReaderMode::Inline));
    for m in ["test_logloss", "test_auc", "examples"] {
        assert_eq!(t[m], i[m], "{m}: thread {} inline {}", t[m], i[m]);
    }
    assert!(t["test_auc"].as_f64().unwrap() > 0.99, "{t}");
}
