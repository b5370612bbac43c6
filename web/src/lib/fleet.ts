// The Fleet page's arithmetic, kept pure (and unit-tested): the gateway's /health detail (ADR 0013's
// engine signals, the upstream's slot limit) and the recent-requests log, folded into one row per
// pool with one child row per endpoint. What an engine does not say is shown as unknown, never 0.

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
}

export interface Pool {
  engine: string;
  source: string;
  routing?: string;
  ready: boolean;
  endpoints: Endpoint[];
}

/** One request of the log, as far as rates need it. */
export interface Done {
  servedModel: string;
  endpoint: string | null;
  status: number;
  doneAt: number;
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
  perSecond: number;
  errors: number;
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

function endpointRow(pool: string, engine: string, e: Endpoint, recent: Done[], windowS: number): Row {
  const mine = recent.filter((r) => r.endpoint === e.url);
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
    perSecond: mine.length / windowS,
    errors: mine.filter((r) => r.status >= 400).length,
  };
}

/** One row per pool (its endpoints as children) from /health's upstreams and the log of the last
 * `windowS` seconds before `now` (seconds since the epoch). */
export function fleetRows(upstreams: Record<string, Pool>, log: Done[], now: number, windowS: number): Row[] {
  const recent = log.filter((r) => now - r.doneAt <= windowS);
  return Object.entries(upstreams).map(([name, pool]) => {
    const children = pool.endpoints.map((e) => endpointRow(name, pool.engine, e, recent, windowS));
    const down = children.filter((c) => c.state !== "ready").length;
    const poolLog = recent.filter((r) => r.servedModel === name || children.some((c) => c.name === r.endpoint));
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
      perSecond: poolLog.length / windowS,
      errors: poolLog.filter((r) => r.status >= 400).length,
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
