// The Fleet page's arithmetic, kept pure (and unit-tested): the gateway's /health detail (ADR 0013's
// engine signals, the upstream's slot limit, each endpoint's cumulative request and error counters)
// folded into one row per pool with one child row per endpoint. Rates are the difference of the
// counters between two polls over the time between them. What is not known is shown as unknown
// (or "—" for a rate), never 0.

export interface Signals {
  ageSeconds: number;
  running: number | null;
  waiting: number | null;
  kvUsage: number | null;
  kvCapacityTokens: number | null;
  slotsTotal?: number | null;
}

export interface Endpoint {
  url: string;
  state: "ready" | "down";
  reason: string;
  inFlight: number;
  slotLimit?: number | null;
  signals?: Signals | null;
  /** Attempts on this endpoint that ended, since the gateway (worker) started. */
  finished?: number;
  /** Of those, the ones the endpoint failed (transport, timeout, 429/5xx, broken stream). */
  errors?: number;
}

export interface Pool {
  engine: string;
  source: string;
  routing?: string;
  ready: boolean;
  endpoints: Endpoint[];
}

/** One poll of the counters: when it arrived (seconds) and each endpoint's counters, by URL. */
export interface Sample {
  at: number;
  counts: Record<string, { finished: number; errors: number }>;
}

/** Requests and errors per second of one endpoint between two polls. */
export interface Rate {
  perSecond: number;
  errorsPerSecond: number;
}

export type Rates = Record<string, Rate | null>;

export function sample(upstreams: Record<string, Pool>, at: number): Sample {
  const counts: Sample["counts"] = {};
  for (const pool of Object.values(upstreams)) {
    for (const e of pool.endpoints) {
      if (e.finished !== undefined && e.errors !== undefined) counts[e.url] = { finished: e.finished, errors: e.errors };
    }
  }
  return { at, counts };
}

/** Each endpoint's rate from `before` to `now`; null (shown "—") on the first poll, for an endpoint
 * new since, and when a counter went down (the gateway restarted: `now` is the new baseline). */
export function rates(before: Sample | null, now: Sample): Rates {
  const out: Rates = {};
  const seconds = before ? now.at - before.at : 0;
  for (const [url, c] of Object.entries(now.counts)) {
    const was = before?.counts[url];
    const reset = was !== undefined && (c.finished < was.finished || c.errors < was.errors);
    out[url] =
      was === undefined || reset || seconds <= 0
        ? null
        : { perSecond: (c.finished - was.finished) / seconds, errorsPerSecond: (c.errors - was.errors) / seconds };
  }
  return out;
}

/** The sum of known rates; null when any is unknown (a partial sum would understate). */
export function total(values: (Rate | null)[]): Rate | null {
  if (!values.length || values.some((v) => v === null)) return null;
  return values.reduce<Rate>(
    (n, v) => ({ perSecond: n.perSecond + (v?.perSecond ?? 0), errorsPerSecond: n.errorsPerSecond + (v?.errorsPerSecond ?? 0) }),
    { perSecond: 0, errorsPerSecond: 0 },
  );
}

/** A rate as shown: "—" until two polls are known. */
export function perSecond(value: number | null | undefined): string {
  return value === null || value === undefined ? "—" : value.toFixed(2);
}

export interface Row {
  key: string;
  pool: string;
  engine: string;
  name: string;
  state: "ready" | "down" | "degraded";
  reason: string;
  inFlight: number;
  slotLimit: number | null;
  busy: number | null;
  total: number | null;
  waiting: number | null;
  kvUsage: number | null;
  kvCapacityTokens: number | null;
  rate: Rate | null;
  children?: Row[];
}

export const UNKNOWN = "unknown";

/** "busy / total" of the engine's sequence slots; unknown where the engine does not say. */
export function slots(busy: number | null, total: number | null): string {
  if (busy === null && total === null) return UNKNOWN;
  return `${busy ?? UNKNOWN} / ${total ?? UNKNOWN}`;
}

/** The gateway's own count against the upstream's limit ("3 / 8"; "3" when unlimited). */
export function inFlight(count: number, limit: number | null): string {
  return limit === null ? String(count) : `${count} / ${limit}`;
}

export function kv(usage: number | null, capacity: number | null): string {
  if (usage === null) return capacity === null ? UNKNOWN : `${UNKNOWN} of ${capacity.toLocaleString("en-US")} tokens`;
  const share = `${(usage * 100).toFixed(1)}%`;
  return capacity === null ? share : `${share} of ${capacity.toLocaleString("en-US")} tokens`;
}

function sum(values: (number | null)[]): number | null {
  return values.some((v) => v === null) ? null : values.reduce<number>((n, v) => n + (v ?? 0), 0);
}

function endpointRow(pool: string, engine: string, e: Endpoint, known: Rates): Row {
  const s = e.signals ?? null;
  return {
    key: `${pool} ${e.url}`,
    pool,
    engine,
    name: e.url,
    state: e.state,
    reason: e.reason,
    inFlight: e.inFlight,
    slotLimit: e.slotLimit ?? null,
    busy: s?.running ?? null,
    total: s?.slotsTotal ?? null,
    waiting: s?.waiting ?? null,
    kvUsage: s?.kvUsage ?? null,
    kvCapacityTokens: s?.kvCapacityTokens ?? null,
    rate: known[e.url] ?? null,
  };
}

/** One row per pool (its endpoints as children) from /health's upstreams and the endpoints' rates
 * (`rates` of the last two polls). */
export function fleetRows(upstreams: Record<string, Pool>, known: Rates): Row[] {
  return Object.entries(upstreams).map(([name, pool]) => {
    const children = pool.endpoints.map((e) => endpointRow(name, pool.engine, e, known));
    const down = children.filter((c) => c.state !== "ready").length;
    const limits = children.map((c) => c.slotLimit);
    return {
      key: name,
      pool: name,
      engine: pool.engine,
      name,
      state: !pool.ready ? "down" : down ? "degraded" : "ready",
      reason: down ? `${down} of ${children.length} endpoints down` : `${plural(children.length, "endpoint")} ready`,
      inFlight: children.reduce((n, c) => n + c.inFlight, 0),
      slotLimit: children.length ? sum(limits) : null,
      busy: children.length ? sum(children.map((c) => c.busy)) : null,
      total: children.length ? sum(children.map((c) => c.total)) : null,
      waiting: children.length ? sum(children.map((c) => c.waiting)) : null,
      kvUsage: children.length ? max(children.map((c) => c.kvUsage)) : null,
      kvCapacityTokens: children.length ? sum(children.map((c) => c.kvCapacityTokens)) : null,
      rate: total(children.map((c) => c.rate)),
      children,
    };
  });
}

function max(values: (number | null)[]): number | null {
  const known = values.filter((v): v is number => v !== null);
  return known.length ? Math.max(...known) : null;
}

function plural(n: number, noun: string): string {
  return `${n} ${noun}${n === 1 ? "" : "s"}`;
}
