//! What the GPU backend does beyond the ops `tests/ops.rs` checks on every backend: argmax with
//! ties against the CPU backend, memory the device cannot hold, and a lost device. Skips (and says
//! so) only where no GPU adapter exists at all and `SAGUARO_REQUIRE_GPU=1` is not set (tests/util/gpu.rs).

use futures::executor::block_on;
use saguaro::backend::cpu::{CpuBackend, Tensor as CpuTensor};
use saguaro::backend::gpu::GpuOptions;
use saguaro::backend::random_weight;
use saguaro::backend::Backend;
use saguaro::storage::quant::DType;
use saguaro::Error;
use util::rand::TestRng;

mod util;

#[test]
fn argmax_matches_with_ties() {
    let Some(g) = util::shared_gpu() else { return };
    let mut rng = TestRng::new(17);
    let (rows, cols) = (6, 151_936);
    let mut data = rng.vec(rows * cols);
    // Row 1: a tie between two maxima far apart; row 2: all equal; row 3: max in the last column.
    data[cols + 5] = 3.0;
    data[cols + 100_000] = 3.0;
    data[2 * cols..3 * cols].fill(0.5);
    data[4 * cols - 1] = 9.0;
    let gx = g.upload(rows, cols, &data).unwrap();
    let want = block_on(CpuBackend::new(1).unwrap().argmax(&CpuTensor::new(rows, cols, data))).unwrap();
    assert_eq!(block_on(g.argmax(&gx)).unwrap(), want);
    assert_eq!(&want[1..4], &[5, 0, cols as u32 - 1]);
    let small = g.upload(3, 1, &[1.0, -2.0, 0.0]).unwrap();
    assert_eq!(block_on(g.argmax(&small)).unwrap(), vec![0, 0, 0]);
}

#[test]
fn more_memory_than_the_device_holds_is_an_error() {
    let Some(g) = util::shared_gpu() else { return };
    assert!(matches!(g.new_cache(1, 1 << 30, 1024), Err(Error::OutOfMemory(_))));
}

#[test]
fn a_lost_device_is_an_error_and_a_new_one_works() {
    let Some(g) = util::open_gpu(GpuOptions::default()) else { return };
    let w = g.load_weight(&random_weight(DType::Q4K, 8, 256, 5).unwrap()).unwrap();
    let x = g.upload(1, 256, &[0.5; 256]).unwrap();
    g.release();
    let lost = |r: Result<Vec<f32>, Error>| match r {
        Err(Error::DeviceLost(msg)) => assert!(msg.contains("released"), "says what happened: {msg}"),
        other => panic!("expected DeviceLost, got {other:?}"),
    };
    lost(g.matmul(&x, &w, None).and_then(|y| block_on(g.read(&y))));
    lost(block_on(g.read(&x)));
    let fresh = util::open_gpu(GpuOptions::default()).unwrap();
    let (w, x) = (fresh.load_weight(&random_weight(DType::Q4K, 8, 256, 5).unwrap()).unwrap(), fresh.upload(1, 256, &[0.5; 256]).unwrap());
    let y = block_on(fresh.read(&fresh.matmul(&x, &w, None).unwrap())).unwrap();
    assert_eq!(y.len(), 8);
    assert!(y.iter().all(|v| v.is_finite()));
}
