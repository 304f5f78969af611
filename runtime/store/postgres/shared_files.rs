//! Attached files by hash, for mail that crosses nodes: the sender puts a mail's bytes in the
//! shared table before the mail leaves ([`PostgresStore::put_files`]), and the node that
//! receives the references fills them from it ([`PostgresStore::fill_files`]), so only
//! references travel.

use std::collections::HashMap;
use std::sync::Arc;

use super::PostgresStore;
use crate::store::StoreResult;
use crate::vocab::FileRef;

impl PostgresStore {
    /// Keeps the bytes of each of `files` that holds them (once per hash).
    pub fn put_files(&self, files: &[FileRef]) -> StoreResult<()> {
        if files.iter().all(|f| f.data.is_none()) {
            return Ok(());
        }
        self.with(|mut client| async move {
            let e = |e| self.err(e);
            let tx = client.transaction().await.map_err(e)?;
            super::save_files(&tx, files.iter()).await.map_err(e)?;
            tx.commit().await.map_err(e)
        })
    }

    /// Gives each of `files` without bytes the bytes kept under its hash, if any are.
    pub fn fill_files(&self, files: &mut [FileRef]) -> StoreResult<()> {
        let mut wanted: Vec<String> = files
            .iter()
            .filter(|f| f.data.is_none())
            .map(|f| f.sha256.clone())
            .collect();
        if wanted.is_empty() {
            return Ok(());
        }
        wanted.sort_unstable();
        wanted.dedup();
        let bytes: HashMap<String, Arc<[u8]>> = self.with(|client| async move {
            let rows = client
                .query(
                    "SELECT sha256, data FROM colony_files WHERE sha256 = ANY($1)",
                    &[&wanted],
                )
                .await
                .map_err(|e| self.err(e))?;
            Ok(rows
                .iter()
                .map(|r| (r.get::<_, String>(0), Arc::from(r.get::<_, &[u8]>(1))))
                .collect())
        })?;
        for file in files.iter_mut().filter(|f| f.data.is_none()) {
            file.data = bytes.get(&file.sha256).cloned();
        }
        Ok(())
    }
}
