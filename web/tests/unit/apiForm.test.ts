import { describe, expect, it } from "vitest";
import { ApiError } from "../../src/lib/api";
import { placeError } from "../../src/lib/apiForm";

describe("placeError", () => {
  const fields = ["limit", "window"];

  it("puts a 400 on the field it names", () => {
    const bad = new ApiError("window must be N + s|m|h|d|w|mo", 400, "invalid_value", "window");
    expect(placeError(bad, fields)).toEqual({ field: "window", message: "window must be N + s|m|h|d|w|mo" });
  });

  it("shows what no field of the form can show above it, never drops it", () => {
    expect(placeError(new ApiError("forbidden", 403, "forbidden", null), fields)).toEqual({ message: "forbidden" });
    expect(placeError(new ApiError("no tenant", 400, null, "scopeId"), fields)).toEqual({ message: "no tenant" });
    expect(placeError(new TypeError("Failed to fetch"), fields)).toEqual({ message: "Failed to fetch" });
  });
});
