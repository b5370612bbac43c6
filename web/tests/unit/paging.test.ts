import { describe, expect, it } from "vitest";
import { back, FIRST, forward, MAX_SEARCH, pageNumber, pagePath, searchPath } from "../../src/lib/paging";

describe("server-side pages", () => {
  it("asks for a limit, and the cursor only after the first page", () => {
    expect(pagePath("/api/v1/keys", undefined, 50)).toBe("/api/v1/keys?limit=50");
    expect(pagePath("/api/v1/keys?projectId=a%2Fb", "eyJ9", 50)).toBe("/api/v1/keys?projectId=a%2Fb&limit=50&after=eyJ9");
    expect(pagePath("/api/v1/keys?after=old&limit=5", undefined, 10)).toBe("/api/v1/keys?limit=10");
  });

  it("escapes a cursor that holds URL characters", () => {
    expect(pagePath("/x", "a+b/c=", 1)).toBe("/x?limit=1&after=a%2Bb%2Fc%3D");
  });

  it("goes forward and back through the cursors it passed", () => {
    const second = forward(FIRST, "c1");
    const third = forward(second, "c2");
    expect(pageNumber(third)).toBe(3);
    expect(third.after).toBe("c2");
    expect(back(third)).toEqual(second);
    expect(back(back(third))).toEqual(FIRST);
    expect(back(FIRST)).toEqual(FIRST);
  });

  it("searches a list on the server: trimmed, bounded, from its first page", () => {
    expect(searchPath("/api/v1/tenants", "", 20)).toBe("/api/v1/tenants?limit=20");
    expect(searchPath("/api/v1/tenants", "  ac me ", 20)).toBe("/api/v1/tenants?limit=20&q=ac+me");
    expect(searchPath("/api/v1/projects?tenantId=a&after=c&q=old", "x&y", 5)).toBe("/api/v1/projects?tenantId=a&q=x%26y&limit=5");
    expect(searchPath("/p", "z".repeat(MAX_SEARCH + 10), 1)).toBe(`/p?limit=1&q=${"z".repeat(MAX_SEARCH)}`);
  });
});
