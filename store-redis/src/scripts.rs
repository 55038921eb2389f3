//! The Lua scripts (`lua/*.lua`, each prefixed with `lua/prelude.lua`) and how they are called:
//! `EVALSHA` by their SHA-1, and `EVAL` with the source (which caches it) when the server answers
//! `NOSCRIPT` (after a restart, a failover or `SCRIPT FLUSH`); optionally followed by `WAIT` in
//! the same round trip. Every call checks that its keys share one cluster slot before it is sent.

use std::sync::LazyLock;

use redis::{Cmd, ErrorKind, FromRedisValue, ServerErrorKind, Value};
use watukuy_core::{Error, Result, store::StoreErrorKind};

use crate::conn::Conn;
use crate::keys::slot;
use crate::options::WaitReplicas;

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
        let first = keys.first().map(|k| slot(k.as_ref()));
        let cross_slot = keys
            .iter()
            .map(AsRef::as_ref)
            .find(|key| Some(slot(key)) != first)
            .map(str::to_owned);
        Call {
            script: self,
            keys: keys.iter().map(|k| k.as_ref().to_owned()).collect(),
            args: Vec::new(),
            cross_slot,
        }
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
    pub(crate) claim: Lua,
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
    pub(crate) fn all(&'static self) -> [&'static Lua; 20] {
        [
            &self.register_key,
            &self.unregister_key,
            &self.acquire_lease,
            &self.claim,
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
    claim: lua!("claim"),
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

/// One script invocation: the script, its keys and its arguments.
pub(crate) struct Call {
    script: &'static Lua,
    keys: Vec<String>,
    args: Vec<Vec<u8>>,
    /// A key in another cluster slot than the first key: the call is refused before it is sent.
    cross_slot: Option<String>,
}

impl Call {
    /// Adds an argument (`ARGV[n]`): any string, passed as opaque bytes.
    pub(crate) fn arg(mut self, arg: impl redis::ToRedisArgs) -> Self {
        self.args.extend(arg.to_redis_args());
        self
    }

    /// Adds arguments in place (for loops).
    pub(crate) fn push(&mut self, arg: impl redis::ToRedisArgs) -> &mut Self {
        self.args.extend(arg.to_redis_args());
        self
    }

    /// `EVALSHA <sha> …`, or `EVAL <source> …` (which also caches the script on the server that
    /// runs it) after a `NOSCRIPT`.
    fn cmd(&self, source: bool) -> Cmd {
        let mut cmd = if source {
            let mut cmd = redis::cmd("EVAL");
            cmd.arg(self.script.source);
            cmd
        } else {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(&self.script.sha);
            cmd
        };
        cmd.arg(self.keys.len()).arg(&self.keys);
        for arg in &self.args {
            cmd.arg(arg.as_slice());
        }
        cmd
    }
}

fn is_noscript(error: &redis::RedisError) -> bool {
    error.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
}

/// Loads `script` into the server's script cache (`SCRIPT LOAD`; on a cluster, into every
/// primary's), checking the SHA it reports.
pub(crate) async fn load(conn: &Conn, script: &Lua) -> Result<()> {
    let mut conn = conn.clone();
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(script.source)
        .query_async(&mut conn)
        .await
        .map_err(|e| conn.classify(e))?;
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

/// Runs one script: `EVALSHA`, and on `NOSCRIPT` `EVAL` with its source.
pub(crate) async fn run<T: FromRedisValue>(conn: &Conn, call: Call) -> Result<T> {
    let script = call.script;
    let (mut values, _) = exec(conn, vec![call], None).await?;
    convert(script, values.pop().unwrap_or(Value::Nil))
}

/// Runs one script followed by `WAIT` (when `wait` is set) in the same round trip, on the same
/// connection. Returns the script's reply and, apart, whether enough replicas acknowledged the
/// write: the caller decides whether the script wrote anything the `WAIT` was about.
pub(crate) async fn run_waited<T: FromRedisValue>(
    conn: &Conn,
    call: Call,
    wait: Option<WaitReplicas>,
) -> Result<(T, Result<()>)> {
    let script = call.script;
    let (mut values, waited) = exec(conn, vec![call], wait).await?;
    Ok((convert(script, values.pop().unwrap_or(Value::Nil))?, waited))
}

/// Runs several scripts in order, each atomic on its own (a pipeline, not a transaction), in one
/// round trip on a standalone Redis and one per script on a cluster (their keys may live in
/// different slots). A script the server did not know (`NOSCRIPT`, so it did not run) is run
/// again on its own after the rest, with `EVAL`, so no script runs twice; callers only group scripts
/// whose order does not matter for correctness. Fails with the first other error.
pub(crate) async fn run_many(conn: &Conn, calls: Vec<Call>) -> Result<Vec<Value>> {
    Ok(exec(conn, calls, None).await?.0)
}

/// Like [`run_many`], with `WAIT` after the last script (see [`run_waited`]).
pub(crate) async fn run_many_waited(
    conn: &Conn,
    calls: Vec<Call>,
    wait: Option<WaitReplicas>,
) -> Result<(Vec<Value>, Result<()>)> {
    exec(conn, calls, wait).await
}

/// Sends `calls` (one pipeline, or one per call on a cluster), `WAIT` after the last one when
/// asked, rerunning with `EVAL` the scripts the server did not know.
async fn exec(
    conn: &Conn,
    calls: Vec<Call>,
    wait: Option<WaitReplicas>,
) -> Result<(Vec<Value>, Result<()>)> {
    if let Some(call) = calls.iter().find(|c| c.cross_slot.is_some()) {
        return Err(Error::store(
            StoreErrorKind::Rejected,
            false,
            format!(
                "script {} would touch keys of two cluster slots ({})",
                call.script.name,
                call.cross_slot.as_deref().unwrap_or_default()
            ),
        ));
    }
    let groups: Vec<Vec<&Call>> = if conn.is_cluster() {
        calls.iter().map(|c| vec![c]).collect()
    } else {
        vec![calls.iter().collect()]
    };
    let last = groups.len().saturating_sub(1);
    let mut out = Vec::with_capacity(calls.len());
    let mut waited = Ok(());
    for (i, group) in groups.into_iter().enumerate() {
        let wait = if i == last { wait } else { None };
        let (values, w) = send(conn, &group, wait, false).await?;
        waited = w;
        for (call, value) in group.into_iter().zip(values) {
            match value {
                Value::ServerError(server) => {
                    let error = redis::RedisError::from(server);
                    if !is_noscript(&error) {
                        return Err(conn.classify(error));
                    }
                    // `EVAL` with the source, routed like the call: after a failover the
                    // server that answered may be the only one without the script.
                    let (mut again, w) = send(conn, &[call], wait, true).await?;
                    if wait.is_some() {
                        waited = w;
                    }
                    match again.pop() {
                        Some(Value::ServerError(server)) => {
                            return Err(conn.classify(redis::RedisError::from(server)));
                        }
                        Some(value) => out.push(value),
                        None => out.push(Value::Nil),
                    }
                }
                value => out.push(value),
            }
        }
    }
    Ok((out, waited))
}

/// One pipeline: the calls, then `WAIT` when asked. Returns one reply per call (server errors as
/// values) and the `WAIT` verdict.
async fn send(
    conn: &Conn,
    calls: &[&Call],
    wait: Option<WaitReplicas>,
    source: bool,
) -> Result<(Vec<Value>, Result<()>)> {
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    for call in calls {
        pipe.add_command(call.cmd(source));
    }
    if let Some(wait) = wait {
        pipe.cmd("WAIT")
            .arg(wait.replicas)
            .arg(u64::try_from(wait.timeout.as_millis()).unwrap_or(u64::MAX));
    }
    let mut c = conn.clone();
    let mut replies: Vec<Value> = pipe
        .query_async(&mut c)
        .await
        .map_err(|e| conn.classify(e))?;
    let expected = calls.len() + usize::from(wait.is_some());
    if replies.len() != expected {
        return Err(Error::store(
            StoreErrorKind::Corrupt,
            false,
            format!(
                "Redis answered {} replies to a pipeline of {expected} commands",
                replies.len(),
            ),
        ));
    }
    let waited = match wait {
        None => Ok(()),
        Some(wait) => verdict(conn, wait, replies.pop().unwrap_or(Value::Nil)),
    };
    Ok((replies, waited))
}

/// Whether `WAIT` answered that enough replicas have the write.
fn verdict(conn: &Conn, wait: WaitReplicas, reply: Value) -> Result<()> {
    let acked: i64 = match reply {
        Value::ServerError(server) => return Err(conn.classify(redis::RedisError::from(server))),
        value => redis::from_redis_value(value).map_err(|e| {
            Error::store_with(
                StoreErrorKind::Corrupt,
                false,
                "unexpected reply to WAIT",
                redis::RedisError::from(e),
            )
        })?,
    };
    if usize::try_from(acked).is_ok_and(|n| n >= wait.replicas) {
        Ok(())
    } else {
        Err(Error::store(
            StoreErrorKind::Timeout,
            true,
            format!(
                "Redis applied the write, but only {acked} of the {} replicas asked for \
                 (redis.wait_replicas) acknowledged it within {} ms: a failover now could lose it",
                wait.replicas,
                wait.timeout.as_millis()
            ),
        ))
    }
}

/// Converts one reply of [`run_many`].
pub(crate) fn reply<T: FromRedisValue>(script: &'static Lua, value: Value) -> Result<T> {
    convert(script, value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_across_slots_is_flagged() {
        let one = SCRIPTS
            .commit_poll
            .call(&["w:p:{a:}:meta", "w:p:{a:}:state"]);
        assert!(one.cross_slot.is_none());
        let two = SCRIPTS
            .register_key
            .call(&["w:{keys}:pollers", "w:p:{a:}:meta"]);
        assert_eq!(two.cross_slot.as_deref(), Some("w:p:{a:}:meta"));
    }

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
