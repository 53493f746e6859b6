//! Budgets and rate limits in Redis, shared by every replica.
//!
//! One call is one atomic step: a Lua script (loaded at start, run by
//! `EVALSHA`) checks the tenant, run and run-tool rate limits (GCRA on
//! Redis `TIME`, never a replica's clock), the run's end, step cap and cost
//! cap and the tenant's daily cap, and reserves the step and the price. It
//! returns a reservation id; [`settle`](RedisBudgets::settle) runs a second
//! script that refunds or replaces the reservation and deletes it in the
//! same step, so a retried settle finds nothing and cannot refund twice.
//!
//! Money is integer micro-units. Every key of a tenant carries the tenant as
//! its hash tag (`mcpfw:{acme}:…`), so a Redis Cluster keeps one tenant's
//! keys on one node and the script stays atomic. The upstream's own rate
//! (`max_calls_per_s`), shared by all tenants, is its own key and its own
//! step, asked first. Run state lives `run_state_ttl_s` after the run's
//! last call (as in memory); rate-limit keys expire when their window does.

use std::sync::Arc;
use std::time::Duration;

use redis::Script;

use crate::state::{key_part, Redis, Unavailable};

use super::{CallBudget, Refusal, Settle};

/// A reservation in Redis, settled once.
#[derive(Debug, Clone)]
pub struct SharedReservation {
    tenant: String,
    run: String,
    id: String,
}

/// The budgets of every replica, in one Redis.
pub struct RedisBudgets {
    redis: Arc<Redis>,
    admit: Script,
    settle: Script,
    upstream: Script,
    ttl_ms: u64,
    daily_cap: Option<i64>,
    per_tenant_per_s: u32,
    per_run_per_s: u32,
    per_run_tool_per_s: u32,
}

/// Prices as integer micro-units (rounded; negative and non-finite are 0).
pub(crate) fn micros(price: f64) -> i64 {
    if price.is_finite() && price > 0.0 {
        (price * 1_000_000.0).round().min(i64::MAX as f64) as i64
    } else {
        0
    }
}

fn units(micros: i64) -> f64 {
    micros as f64 / 1_000_000.0
}

/// The admission step. KEYS: tenant rate, run state, run-tool rate, tenant
/// days, reservation. ARGV: tenant, run and run-tool rates per second (0:
/// none), step cap, run cost cap (-1: none), price, tenant daily cap (-1:
/// none), the run's end in ms (-1: none), run state lifetime in ms.
/// Answers `{0, steps}` admitted; `{1, scope, retry_ms}` rate limited
/// (scope 1 tenant, 2 run, 3 run-tool); `{2, ends_ms}` run ended;
/// `{3, used, max}` step cap; `{4, scope, spent, price, cap}` cost cap
/// (scope 1 run, 2 tenant day).
const ADMIT: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_ms = math.floor(now / 1000)
local function gcra(tat, per_s)
  local interval = 1000000 / per_s
  local base = math.max(tonumber(tat) or 0, now)
  local new = base + interval
  local allow_at = new - interval * per_s
  if allow_at > now then return nil, math.ceil((allow_at - now) / 1000) end
  return new, 0
end
local rates = {tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])}
local tats = {}
local olds = {redis.call('GET', KEYS[1]), redis.call('HGET', KEYS[2], 'tat'), redis.call('GET', KEYS[3])}
for i = 1, 3 do
  if rates[i] > 0 then
    local new, wait = gcra(olds[i], rates[i])
    if not new then return {1, i, wait} end
    tats[i] = new
  end
end
if tats[1] then redis.call('SET', KEYS[1], string.format('%d', tats[1]), 'PX', math.ceil((tats[1] - now) / 1000) + 1) end
if tats[3] then redis.call('SET', KEYS[3], string.format('%d', tats[3]), 'PX', math.ceil((tats[3] - now) / 1000) + 1) end
local ttl = tonumber(ARGV[9])
if tats[2] then redis.call('HSET', KEYS[2], 'tat', string.format('%d', tats[2])) end
local st = redis.call('HMGET', KEYS[2], 'steps', 'cost', 'ends')
local steps = tonumber(st[1]) or 0
local cost = tonumber(st[2]) or 0
local ends = tonumber(st[3]) or -1
local e = tonumber(ARGV[8])
if e >= 0 and (ends < 0 or e < ends) then
  ends = e
  redis.call('HSET', KEYS[2], 'ends', string.format('%d', ends))
end
if redis.call('EXISTS', KEYS[2]) == 1 then redis.call('PEXPIRE', KEYS[2], ttl) end
if ends >= 0 and now_ms >= ends then return {2, ends} end
local max_steps = tonumber(ARGV[4])
if steps >= max_steps then return {3, steps, max_steps} end
local price = tonumber(ARGV[6])
local max_cost = tonumber(ARGV[5])
if max_cost >= 0 and cost + price > max_cost then return {4, 1, cost, price, max_cost} end
local day_cap = tonumber(ARGV[7])
local day = math.floor(now_ms / 86400000)
if day_cap >= 0 then
  local spent = tonumber(redis.call('HGET', KEYS[4], tostring(day))) or 0
  if spent + price > day_cap then return {4, 2, spent, price, day_cap} end
  redis.call('HINCRBY', KEYS[4], tostring(day), price)
  redis.call('HDEL', KEYS[4], tostring(day - 2))
  redis.call('PEXPIRE', KEYS[4], 3 * 86400000)
end
redis.call('HINCRBY', KEYS[2], 'steps', 1)
redis.call('HINCRBY', KEYS[2], 'cost', price)
redis.call('PEXPIRE', KEYS[2], ttl)
if day_cap >= 0 then
  redis.call('HSET', KEYS[5], 'price', price, 'day', tostring(day))
else
  redis.call('HSET', KEYS[5], 'price', price)
end
redis.call('PEXPIRE', KEYS[5], ttl)
return {0, steps + 1}
"#;

/// The settle step. KEYS: reservation, run state, tenant days. ARGV: `0`
/// keep the reservation as charged, `1` refund it, `2` replace its price by
/// `ARGV[2]`. Answers 1 when it settled, 0 when it was already settled.
const SETTLE: &str = r#"
local r = redis.call('HMGET', KEYS[1], 'price', 'day')
if not r[1] then return 0 end
redis.call('DEL', KEYS[1])
local price = tonumber(r[1])
local mode = ARGV[1]
if mode == '0' then return 1 end
local delta = 0
if mode == '1' then delta = -price else delta = tonumber(ARGV[2]) - price end
local function adjust(key, field, by)
  if redis.call('EXISTS', key) == 0 then return end
  local v = (tonumber(redis.call('HGET', key, field)) or 0) + by
  if v < 0 then v = 0 end
  redis.call('HSET', key, field, string.format('%d', v))
end
if mode == '1' then adjust(KEYS[2], 'steps', -1) end
if delta ~= 0 then
  adjust(KEYS[2], 'cost', delta)
  if r[2] then adjust(KEYS[3], r[2], delta) end
end
return 1
"#;

/// The upstream's rate. KEYS: its rate key. ARGV: per second. Answers 0,
/// or the milliseconds until a retry can succeed.
const UPSTREAM: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local per_s = tonumber(ARGV[1])
local interval = 1000000 / per_s
local base = math.max(tonumber(redis.call('GET', KEYS[1])) or 0, now)
local new = base + interval
local allow_at = new - interval * per_s
if allow_at > now then return math.ceil((allow_at - now) / 1000) end
redis.call('SET', KEYS[1], string.format('%d', new), 'PX', math.ceil((new - now) / 1000) + 1)
return 0
"#;

/// What an admission in Redis came to.
pub enum Admitted {
    /// Reserved.
    Reserved {
        /// To settle.
        reservation: SharedReservation,
        /// Steps used including this call.
        steps_used: u32,
    },
    /// Refused by a limit or cap.
    Refused(Refusal),
}

impl RedisBudgets {
    /// Budgets in `redis`, with the limits of `[limits]`.
    pub fn new(redis: Arc<Redis>, cfg: &super::LimitsConfig) -> RedisBudgets {
        RedisBudgets {
            redis,
            admit: Script::new(ADMIT),
            settle: Script::new(SETTLE),
            upstream: Script::new(UPSTREAM),
            ttl_ms: cfg.run_state_ttl_s.saturating_mul(1000).max(1000),
            daily_cap: cfg.tenant_daily_cost.map(micros),
            per_tenant_per_s: cfg.per_tenant_per_s,
            per_run_per_s: cfg.per_run_per_s,
            per_run_tool_per_s: cfg.per_run_tool_per_s,
        }
    }

    /// The connection.
    pub fn redis(&self) -> &Arc<Redis> {
        &self.redis
    }

    /// Loads the scripts (start-up; `EVALSHA` reloads them after a Redis
    /// restart anyway).
    pub async fn load(&self) -> Result<(), Unavailable> {
        for s in [&self.admit, &self.settle, &self.upstream] {
            self.redis
                .run(|mut c| async move { s.prepare_invoke().load_async(&mut c).await })
                .await?;
        }
        Ok(())
    }

    fn key(&self, tenant: &str, rest: std::fmt::Arguments<'_>) -> String {
        format!("{}:{{{}}}:{rest}", self.redis.prefix(), key_part(tenant))
    }

    /// Checks the limits and caps of `call` and reserves its step and
    /// price, atomically across replicas.
    pub async fn admit(&self, call: &CallBudget<'_>) -> Result<Admitted, Unavailable> {
        if let Some(per_s) = call.upstream_per_s.filter(|n| *n > 0) {
            let key = format!(
                "{}:{{up:{}}}:rate",
                self.redis.prefix(),
                key_part(call.upstream)
            );
            let script = &self.upstream;
            let wait: i64 = self
                .redis
                .run(|mut c| async move { script.key(&key).arg(per_s).invoke_async(&mut c).await })
                .await?;
            if wait > 0 {
                return Ok(Admitted::Refused(Refusal::RateLimited {
                    scope: "upstream",
                    retry_after: Duration::from_millis(wait as u64),
                }));
            }
        }
        let tenant = call.tenant;
        let run = key_part(call.run);
        let id = uuid::Uuid::new_v4().simple().to_string();
        let keys = [
            self.key(tenant, format_args!("rate")),
            self.key(tenant, format_args!("run:{run}")),
            self.key(tenant, format_args!("tool:{run}:{}", key_part(call.tool))),
            self.key(tenant, format_args!("days")),
            self.key(tenant, format_args!("res:{id}")),
        ];
        let price = micros(call.price);
        let args: [i64; 9] = [
            i64::from(self.per_tenant_per_s),
            i64::from(call.run_per_s.unwrap_or(self.per_run_per_s)),
            i64::from(self.per_run_tool_per_s),
            i64::from(call.max_steps),
            call.max_cost.map_or(-1, micros),
            price,
            self.daily_cap.unwrap_or(-1),
            call.run_exp.map_or(-1, |s| {
                i64::try_from(s.saturating_mul(1000)).unwrap_or(i64::MAX)
            }),
            i64::try_from(self.ttl_ms).unwrap_or(i64::MAX),
        ];
        let script = &self.admit;
        let answer: Vec<i64> = self
            .redis
            .run(|mut c| async move {
                let mut inv = script.prepare_invoke();
                for k in &keys {
                    inv.key(k);
                }
                for a in args {
                    inv.arg(a);
                }
                inv.invoke_async(&mut c).await
            })
            .await?;
        let at = |i: usize| answer.get(i).copied().unwrap_or(0);
        Ok(match at(0) {
            0 => Admitted::Reserved {
                reservation: SharedReservation {
                    tenant: tenant.to_owned(),
                    run: call.run.to_owned(),
                    id,
                },
                steps_used: u32::try_from(at(1)).unwrap_or(u32::MAX),
            },
            1 => Admitted::Refused(Refusal::RateLimited {
                scope: match at(1) {
                    1 => "tenant",
                    2 => "run",
                    _ => "run_tool",
                },
                retry_after: Duration::from_millis(at(2).max(1) as u64),
            }),
            2 => Admitted::Refused(Refusal::RunEnded {
                at_s: (at(1) / 1000) as u64,
            }),
            3 => Admitted::Refused(Refusal::StepCap {
                used: u32::try_from(at(1)).unwrap_or(u32::MAX),
                max: u32::try_from(at(2)).unwrap_or(u32::MAX),
            }),
            4 => Admitted::Refused(Refusal::CostCap {
                scope: if at(1) == 1 { "run" } else { "tenant_day" },
                spent: units(at(2)),
                price: units(at(3)),
                cap: units(at(4)),
            }),
            other => {
                return Err(Unavailable::Failed(format!(
                    "the admission script answered {other}"
                )))
            }
        })
    }

    /// Settles a reservation, exactly once however often it is retried.
    pub async fn settle(&self, r: &SharedReservation, how: Settle) -> Result<bool, Unavailable> {
        let run = key_part(&r.run);
        let keys = [
            self.key(&r.tenant, format_args!("res:{}", r.id)),
            self.key(&r.tenant, format_args!("run:{run}")),
            self.key(&r.tenant, format_args!("days")),
        ];
        let (mode, replaced) = match how {
            Settle::NotExecuted => (1, 0),
            Settle::Executed {
                reported: Some(cost),
            } if cost.is_finite() && cost >= 0.0 => (2, micros(cost)),
            Settle::Executed { .. } => (0, 0),
        };
        let script = &self.settle;
        let settled: i64 = self
            .redis
            .run(|mut c| async move {
                let mut inv = script.prepare_invoke();
                for k in &keys {
                    inv.key(k);
                }
                inv.arg(mode).arg(replaced).invoke_async(&mut c).await
            })
            .await?;
        Ok(settled == 1)
    }

    /// Steps and cost (in units) of a run, as Redis holds them.
    pub async fn run_state(&self, tenant: &str, run: &str) -> Result<(u32, f64), Unavailable> {
        let key = self.key(tenant, format_args!("run:{}", key_part(run)));
        let (steps, cost): (Option<u32>, Option<i64>) = self
            .redis
            .run(|mut c| async move {
                redis::cmd("HMGET")
                    .arg(&key)
                    .arg("steps")
                    .arg("cost")
                    .query_async(&mut c)
                    .await
            })
            .await?;
        Ok((steps.unwrap_or(0), units(cost.unwrap_or(0))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn micros_round_and_refuse_nonsense() {
        assert_eq!(micros(0.1), 100_000);
        assert_eq!(micros(0.1 + 0.2), 300_000);
        assert_eq!(micros(-1.0), 0);
        assert_eq!(micros(f64::NAN), 0);
        assert_eq!(units(1_500_000), 1.5);
    }
}
