//! Helpers shared by the integration tests that read files from the traces directory.

use marshal_datasets::DatasetError;

/// `Some` for a loaded file, `None` (with a message) when the traces directory lacks it.
pub fn from_traces_dir<T>(name: &str, result: Result<T, DatasetError>) -> Option<T> {
    match result {
        Ok(value) => Some(value),
        Err(DatasetError::TraceNotFound { file, searched, .. }) => {
            eprintln!("skipped {name}: {file} not found in {searched:?}");
            None
        }
        Err(e) => panic!("{name}: {e}"),
    }
}
