//! The Lua scripts (`lua/*.lua`, each prefixed with `lua/prelude.lua`) and how they are called:
//! `EVALSHA` by their SHA-1, loading the script and calling again when the server answers
//! `NOSCRIPT` (after a restart, a failover or `SCRIPT FLUSH`).

use std::sync::LazyLock;

use redis::aio::ConnectionManager;
use redis::{Cmd, ErrorKind, FromRedisValue, ServerErrorKind, Value};
use watukuy_core::{Error, Result, StoreErrorKind};

use crate::error::classify;

/// One script of the store.
pub(crate) struct Lua {
    /// The file name without `.lua`, for error messages.
    pub(crate) name: &'static str,
    source: &'static str,
    sha: String,
}

impl Lua {
    fn new(name: &'static str, source: &'static str) -> Self {
        Self {
            name,
            source,
            sha: redis::Script::new(source).get_hash().to_owned(),
        }
    }

    /// `EVALSHA <sha> <keys> <args>`; add the arguments with [`Call::arg`].
    pub(crate) fn call<K: AsRef<str>>(&'static self, keys: &[K]) -> Call {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&self.sha).arg(keys.len());
        for key in keys {
            cmd.arg(key.as_ref());
        }
        Call { script: self, cmd }
    }
}

macro_rules! lua {
    ($name:literal) => {
        Lua::new(
            $name,
            concat!(
                include_str!("../lua/prelude.lua"),
                include_str!(concat!("../lua/", $name, ".lua"))
            ),
        )
    };
}

/// Every script of the store.
pub(crate) struct Scripts {
    pub(crate) register_key: Lua,
    pub(crate) unregister_key: Lua,
    pub(crate) acquire_lease: Lua,
    pub(crate) renew_lease: Lua,
    pub(crate) release_lease: Lua,
    pub(crate) save_state: Lua,
    pub(crate) save_state_unfenced: Lua,
    pub(crate) commit_poll: Lua,
    pub(crate) ack_events: Lua,
    pub(crate) record_attempt: Lua,
    pub(crate) park_event: Lua,
    pub(crate) delete_key: Lua,
    pub(crate) load_pending: Lua,
    pub(crate) retry_parked: Lua,
    pub(crate) discard_parked: Lua,
    pub(crate) read_log: Lua,
    pub(crate) prune_log: Lua,
    pub(crate) budget_take: Lua,
    pub(crate) budget_peek: Lua,
}

impl Scripts {
    pub(crate) fn all(&'static self) -> [&'static Lua; 19] {
        [
            &self.register_key,
            &self.unregister_key,
            &self.acquire_lease,
            &self.renew_lease,
            &self.release_lease,
            &self.save_state,
            &self.save_state_unfenced,
            &self.commit_poll,
            &self.ack_events,
            &self.record_attempt,
            &self.park_event,
            &self.delete_key,
            &self.load_pending,
            &self.retry_parked,
            &self.discard_parked,
            &self.read_log,
            &self.prune_log,
            &self.budget_take,
            &self.budget_peek,
        ]
    }
}

/// The scripts, with their SHA-1 computed once.
pub(crate) static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    register_key: lua!("register_key"),
    unregister_key: lua!("unregister_key"),
    acquire_lease: lua!("acquire_lease"),
    renew_lease: lua!("renew_lease"),
    release_lease: lua!("release_lease"),
    save_state: lua!("save_state"),
    save_state_unfenced: lua!("save_state_unfenced"),
    commit_poll: lua!("commit_poll"),
    ack_events: lua!("ack_events"),
    record_attempt: lua!("record_attempt"),
    park_event: lua!("park_event"),
    delete_key: lua!("delete_key"),
    load_pending: lua!("load_pending"),
    retry_parked: lua!("retry_parked"),
    discard_parked: lua!("discard_parked"),
    read_log: lua!("read_log"),
    prune_log: lua!("prune_log"),
    budget_take: lua!("budget_take"),
    budget_peek: lua!("budget_peek"),
});

/// One script invocation: the script and its `EVALSHA` command.
pub(crate) struct Call {
    script: &'static Lua,
    cmd: Cmd,
}

impl Call {
    /// Adds an argument (`ARGV[n]`): any string, passed as opaque bytes.
    pub(crate) fn arg(mut self, arg: impl redis::ToRedisArgs) -> Self {
        self.cmd.arg(arg);
        self
    }

    /// Adds arguments in place (for loops).
    pub(crate) fn push(&mut self, arg: impl redis::ToRedisArgs) -> &mut Self {
        self.cmd.arg(arg);
        self
    }
}

fn is_noscript(error: &redis::RedisError) -> bool {
    error.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
}

/// Loads `script` into the server's script cache (`SCRIPT LOAD`), checking the SHA it reports.
pub(crate) async fn load(conn: &ConnectionManager, script: &Lua) -> Result<()> {
    let mut conn = conn.clone();
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(script.source)
        .query_async(&mut conn)
        .await
        .map_err(classify)?;
    if sha.eq_ignore_ascii_case(&script.sha) {
        Ok(())
    } else {
        Err(Error::store(
            StoreErrorKind::Other,
            false,
            format!(
                "Redis loaded script {} as {sha}, expected {}",
                script.name, script.sha
            ),
        ))
    }
}

fn convert<T: FromRedisValue>(script: &Lua, value: Value) -> Result<T> {
    redis::from_redis_value(value).map_err(|e| {
        Error::store_with(
            StoreErrorKind::Corrupt,
            false,
            format!("unexpected reply from script {}", script.name),
            redis::RedisError::from(e),
        )
    })
}

/// Runs one script: `EVALSHA`, and on `NOSCRIPT` `SCRIPT LOAD` and `EVALSHA` again.
pub(crate) async fn run<T: FromRedisValue>(conn: &ConnectionManager, call: Call) -> Result<T> {
    let mut c = conn.clone();
    let value = match call.cmd.query_async::<Value>(&mut c).await {
        Ok(value) => value,
        Err(e) if is_noscript(&e) => {
            load(conn, call.script).await?;
            call.cmd
                .query_async::<Value>(&mut c)
                .await
                .map_err(classify)?
        }
        Err(e) => return Err(classify(e)),
    };
    convert(call.script, value)
}

/// Runs several scripts in one round trip (a pipeline, not a transaction: each script is atomic
/// on its own, and they run in order). A script the server did not know (`NOSCRIPT`, so it did
/// not run) is loaded and run again on its own after the rest of the pipeline, so no script runs
/// twice; callers only pipeline scripts whose order does not matter for correctness. Fails with
/// the first other error.
pub(crate) async fn run_many(conn: &ConnectionManager, calls: Vec<Call>) -> Result<Vec<Value>> {
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    for call in &calls {
        pipe.add_command(call.cmd.clone());
    }
    let mut c = conn.clone();
    let replies: Vec<Value> = pipe.query_async(&mut c).await.map_err(classify)?;
    if replies.len() != calls.len() {
        return Err(Error::store(
            StoreErrorKind::Corrupt,
            false,
            format!(
                "Redis answered {} replies to a pipeline of {} scripts",
                replies.len(),
                calls.len()
            ),
        ));
    }
    let mut out = Vec::with_capacity(calls.len());
    for (call, reply) in calls.into_iter().zip(replies) {
        match reply {
            Value::ServerError(server) => {
                let error = redis::RedisError::from(server);
                if !is_noscript(&error) {
                    return Err(classify(error));
                }
                load(conn, call.script).await?;
                out.push(
                    call.cmd
                        .query_async::<Value>(&mut c)
                        .await
                        .map_err(classify)?,
                );
            }
            value => out.push(value),
        }
    }
    Ok(out)
}

/// Converts one reply of [`run_many`].
pub(crate) fn reply<T: FromRedisValue>(script: &'static Lua, value: Value) -> Result<T> {
    convert(script, value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_script_has_the_prelude_and_a_distinct_sha() {
        let all = SCRIPTS.all();
        let mut shas: Vec<&str> = all.iter().map(|s| s.sha.as_str()).collect();
        shas.sort_unstable();
        shas.dedup();
        assert_eq!(shas.len(), all.len());
        for script in all {
            assert!(
                script.source.starts_with("-- Shared helpers"),
                "{}",
                script.name
            );
            assert_eq!(script.sha.len(), 40);
        }
    }
}
