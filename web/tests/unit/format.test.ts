import { describe, expect, it } from "vitest";
import { bytes, money, previousMonth, toMicro } from "../../src/lib/format";

describe("money", () => {
  it("shows micro-units exactly to the cent, truncating", () => {
    expect(money(2_509_999, "USD")).toBe("2.50 USD");
    expect(money(-1_230_000)).toBe("-1.23");
    expect(money(1_234_567_000_000)).toBe("1,234,567.00");
  });

  it("reads amounts into micro-units without floating point", () => {
    expect(toMicro("2.5")).toBe(2_500_000);
    expect(toMicro("0.000001")).toBe(1);
    expect(toMicro("1.0000001")).toBeNull();
    expect(toMicro("-1")).toBeNull();
    expect(toMicro("abc")).toBeNull();
  });
});

describe("bytes and months", () => {
  it("shows sizes in binary units", () => {
    expect(bytes(512)).toBe("512 B");
    expect(bytes(4 << 20)).toBe("4.0 MiB");
  });

  it("names the month before, across a year", () => {
    expect(previousMonth(new Date("2026-01-15T00:00:00Z"))).toBe("2025-12");
    expect(previousMonth(new Date("2026-11-30T23:00:00Z"))).toBe("2026-10");
  });
});
