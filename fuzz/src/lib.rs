//! What the fuzz targets share.

use std::future::Future;
use std::sync::LazyLock;

/// One single-threaded runtime for the whole process: the targets run one input at a time.
static RUNTIME: LazyLock<tokio::runtime::Runtime> = LazyLock::new(|| {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
});

/// Runs `future` to its end on the process's runtime.
pub fn block_on<F: Future>(future: F) -> F::Output {
    RUNTIME.block_on(future)
}
