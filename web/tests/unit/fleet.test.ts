import { describe, expect, it } from "vitest";
import { fleetRows, inFlight, kv, slots, type Pool } from "../../src/lib/fleet";

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

describe("fleetRows", () => {
  const now = 1000;
  const log = [
    { servedModel: "m", endpoint: "http://a", status: 200, doneAt: 990 },
    { servedModel: "m", endpoint: "http://a", status: 502, doneAt: 995 },
    { servedModel: "m", endpoint: null, status: 429, doneAt: 999 }, // refused before routing
    { servedModel: "m", endpoint: "http://a", status: 200, doneAt: 900 }, // outside the minute
    { servedModel: "l", endpoint: "http://c", status: 200, doneAt: 999 },
  ];
  const [m, l] = fleetRows(upstreams, log, now, 60);

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

  it("counts requests and errors of the last window per endpoint and per pool", () => {
    expect(m.children?.[0].perSecond).toBeCloseTo(2 / 60);
    expect(m.children?.[0].errors).toBe(1);
    expect(m.perSecond).toBeCloseTo(3 / 60);
    expect(m.errors).toBe(2);
    expect(l.children?.[0].errors).toBe(0);
  });
});
