//! The nodes of a cluster as the database knows them: each one alive while its heartbeat has not
//! expired, on the database's clock (so the nodes' clocks need not agree). Placement
//! (`crate::cluster`) spreads the residents over the nodes alive and takes over the leases of
//! one that is gone.

use std::time::Duration;

use super::PostgresStore;
use super::leases::Lease;
use crate::store::StoreResult;

impl PostgresStore {
    /// The heartbeat of `node`, beaten by the process `instance`: alive for `ttl` from now.
    /// `false` (nothing written) while another process's heartbeat under that name has not
    /// expired: two processes given one `--node` would each take the other's leases for their
    /// own.
    pub fn beat(&self, node: &str, instance: &str, ttl: Duration) -> StoreResult<bool> {
        self.plain("node", node)?;
        let ms = ttl.as_secs_f64() * 1000.0;
        self.with(|client| async move {
            let beaten = client
                .execute(
                    "INSERT INTO colony_nodes (node, instance, expires_at) \
                     VALUES ($1, $2, now() + $3 * interval '1 millisecond') \
                     ON CONFLICT (node) DO UPDATE \
                     SET expires_at = excluded.expires_at, instance = excluded.instance \
                     WHERE colony_nodes.instance = excluded.instance \
                        OR colony_nodes.expires_at <= now()",
                    &[&node, &instance, &ms],
                )
                .await
                .map_err(|e| self.err(e))?;
            Ok(beaten == 1)
        })
    }

    /// The nodes whose heartbeat has not expired, in name order.
    pub fn live_nodes(&self) -> StoreResult<Vec<String>> {
        self.with(|client| async move {
            let rows = client
                .query(
                    "SELECT node FROM colony_nodes WHERE expires_at > now() ORDER BY node",
                    &[],
                )
                .await
                .map_err(|e| self.err(e))?;
            Ok(rows.iter().map(|r| r.get(0)).collect())
        })
    }

    /// `node`, as beaten by `instance`, leaves the cluster at once (the others need not wait
    /// for its heartbeat to expire). Another process's heartbeat under that name stays.
    pub fn leave(&self, node: &str, instance: &str) -> StoreResult<()> {
        self.with(|client| async move {
            client
                .execute(
                    "DELETE FROM colony_nodes WHERE node = $1 AND instance = $2",
                    &[&node, &instance],
                )
                .await
                .map_err(|e| self.err(e))?;
            Ok(())
        })
    }

    /// Every lease the database holds (expired or not), in name order: who runs what.
    pub fn leases(&self) -> StoreResult<Vec<Lease>> {
        self.with(|client| async move {
            let rows = client
                .query(
                    &format!(
                        "SELECT {} FROM colony_leases ORDER BY name",
                        super::leases::LEASE_COLUMNS
                    ),
                    &[],
                )
                .await
                .map_err(|e| self.err(e))?;
            Ok(rows.iter().map(super::leases::lease_of).collect())
        })
    }

    /// The program's identity in this database: the id made once with its schema, and the
    /// database's name. A cluster's nodes share it; another database's program of the same
    /// name has its own, a copy restored into another database (`pg_dump`) included. (A copy
    /// restored into a database of the same name on another server keeps it: give the copy a
    /// new id, `UPDATE colony_identity SET id = md5(random()::text)`, before its nodes share a
    /// NATS server with the original's.)
    pub fn identity(&self) -> StoreResult<String> {
        self.with(|client| async move {
            let row = client
                .query_one(
                    "SELECT id || '/' || current_database() FROM colony_identity",
                    &[],
                )
                .await
                .map_err(|e| self.err(e))?;
            Ok(row.get(0))
        })
    }

    /// Milliseconds since the Unix epoch on the database's clock (to tell an expired lease).
    pub fn now_ms(&self) -> StoreResult<i64> {
        self.with(|client| async move {
            let row = client
                .query_one("SELECT (extract(epoch FROM now()) * 1000)::bigint", &[])
                .await
                .map_err(|e| self.err(e))?;
            Ok(row.get(0))
        })
    }
}
