import { describe, expect, it } from "vitest";
import { fleetRows, inFlight, kv, perSecond, rates, sample, slots, total, type Pool } from "../../src/lib/fleet";

const signals = { ageSeconds: 1, running: 2, waiting: 1, kvUsage: 0.5, kvCapacityTokens: 4096, slotsTotal: null };
const upstreams: Record<string, Pool> = {
  m: {
    engine: "vllm",
    source: "config",
    ready: true,
    endpoints: [
      { url: "http://a", state: "ready", reason: "ok", inFlight: 3, slotLimit: 8, signals },
      { url: "http://b", state: "down", reason: "health check failed", inFlight: 0, slotLimit: 8, signals: null },
    ],
  },
  l: {
    engine: "llamacpp",
    source: "config",
    ready: true,
    endpoints: [
      {
        url: "http://c",
        state: "ready",
        reason: "ok",
        inFlight: 1,
        slotLimit: null,
        signals: { ageSeconds: 1, running: 1, waiting: 0, kvUsage: null, kvCapacityTokens: null, slotsTotal: 4 },
      },
    ],
  },
};

describe("cells", () => {
  it("says unknown where the engine does not tell, never 0", () => {
    expect(slots(2, 4)).toBe("2 / 4");
    expect(slots(2, null)).toBe("2 / unknown");
    expect(slots(null, null)).toBe("unknown");
    expect(kv(null, null)).toBe("unknown");
    expect(kv(0.25, 4096)).toBe("25.0% of 4,096 tokens");
    expect(kv(0.25, null)).toBe("25.0%");
    expect(inFlight(3, 8)).toBe("3 / 8");
    expect(inFlight(3, null)).toBe("3");
  });
});

describe("rates", () => {
  const at = (t: number, a: [number, number], c: [number, number]) => ({
    at: t,
    counts: { "http://a": { finished: a[0], errors: a[1] }, "http://c": { finished: c[0], errors: c[1] } },
  });

  it("is unknown on the first poll, shown as a dash", () => {
    const first = rates(null, at(100, [10, 1], [5, 0]));
    expect(first).toEqual({ "http://a": null, "http://c": null });
    expect(perSecond(first["http://a"]?.perSecond)).toBe("—");
  });

  it("is the counters' difference over the time between the polls", () => {
    const r = rates(at(100, [10, 1], [5, 0]), at(104, [50, 3], [5, 0]));
    expect(r["http://a"]).toEqual({ perSecond: 10, errorsPerSecond: 0.5 });
    expect(r["http://c"]).toEqual({ perSecond: 0, errorsPerSecond: 0 });
    expect(perSecond(r["http://a"]?.perSecond)).toBe("10.00");
  });

  it("resets the baseline when a counter goes down (the gateway restarted), never negative", () => {
    const before = at(100, [1000, 40], [5, 0]);
    const restarted = at(103, [6, 0], [8, 0]);
    expect(rates(before, restarted)["http://a"]).toBeNull();
    expect(rates(before, restarted)["http://c"]).toEqual({ perSecond: 1, errorsPerSecond: 0 });
    expect(rates(restarted, at(105, [16, 2], [8, 0]))["http://a"]).toEqual({ perSecond: 5, errorsPerSecond: 1 });
    expect(rates(before, at(103, [1003, 39], [5, 0]))["http://a"]).toBeNull(); // errors alone went down
  });

  it("is unknown for an endpoint new since the last poll, or no time apart", () => {
    expect(rates({ at: 100, counts: {} }, at(103, [3, 0], [3, 0]))["http://a"]).toBeNull();
    expect(rates(at(100, [1, 0], [1, 0]), at(100, [3, 0], [3, 0]))["http://a"]).toBeNull();
  });

  it("sums a pool's endpoints only when every one is known", () => {
    expect(total([{ perSecond: 1, errorsPerSecond: 0.5 }, { perSecond: 2, errorsPerSecond: 0 }])).toEqual({ perSecond: 3, errorsPerSecond: 0.5 });
    expect(total([{ perSecond: 1, errorsPerSecond: 0 }, null])).toBeNull();
    expect(total([])).toBeNull();
  });

  it("samples the counters /health gives, skipping endpoints without them", () => {
    const pools: Record<string, Pool> = {
      m: { ...upstreams.m, endpoints: [{ ...upstreams.m.endpoints[0], finished: 7, errors: 2 }, upstreams.m.endpoints[1]] },
    };
    expect(sample(pools, 5)).toEqual({ at: 5, counts: { "http://a": { finished: 7, errors: 2 } } });
  });
});

describe("fleetRows", () => {
  const known = {
    "http://a": { perSecond: 2, errorsPerSecond: 0.5 },
    "http://b": { perSecond: 0, errorsPerSecond: 0 },
    "http://c": null,
  };
  const [m, l] = fleetRows(upstreams, known);

  it("folds endpoints into their pool, degraded when one is down", () => {
    expect(m.state).toBe("degraded");
    expect(m.reason).toBe("1 of 2 endpoints down");
    expect(m.inFlight).toBe(3);
    expect(m.slotLimit).toBe(16);
    expect(m.children?.map((c) => c.state)).toEqual(["ready", "down"]);
    expect(l.state).toBe("ready");
    expect(l.reason).toBe("1 endpoint ready");
  });

  it("keeps an unknown unknown when one endpoint does not say", () => {
    expect(m.busy).toBeNull(); // b has no signals
    expect(m.children?.[0].busy).toBe(2);
    expect(m.kvUsage).toBe(0.5); // the fullest known
    expect(l.total).toBe(4);
    expect(l.slotLimit).toBeNull();
  });

  it("gives each endpoint its rate and each pool the sum of its endpoints'", () => {
    expect(m.children?.[0].rate).toEqual({ perSecond: 2, errorsPerSecond: 0.5 });
    expect(m.rate).toEqual({ perSecond: 2, errorsPerSecond: 0.5 });
    expect(l.children?.[0].rate).toBeNull();
    expect(l.rate).toBeNull();
  });
});
