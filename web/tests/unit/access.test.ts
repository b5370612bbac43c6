import { describe, expect, it } from "vitest";
import { canWrite, pageAt, pagesFor } from "../../src/lib/access";

describe("pages by credential", () => {
  it("offers an admin every page", () => {
    expect(pagesFor({ role: "admin" })).toHaveLength(7);
  });

  it("offers a tenant's key its own pages only", () => {
    expect(pagesFor({ role: "tenant", tenantId: "acme" })).toEqual(["playground", "tenants", "usage"]);
  });

  it("offers finance the money pages but not models or fleet", () => {
    const pages = pagesFor({ role: "finance" });
    expect(pages).toContain("costs");
    expect(pages).not.toContain("models");
    expect(pages).not.toContain("fleet");
  });

  it("offers a gateway without a control plane the playground and fleet", () => {
    expect(pagesFor({ role: null })).toEqual(["playground", "fleet"]);
  });

  it("resolves deep links, and falls back when the page is not allowed", () => {
    expect(pageAt("/costs", { role: "finance" })).toBe("costs");
    expect(pageAt("/models/x", { role: "admin" })).toBe("models");
    expect(pageAt("/costs", { role: "tenant" })).toBe("playground");
    expect(pageAt("/", { role: "admin" })).toBe("playground");
  });

  it("lets finance write costs only", () => {
    expect(canWrite({ role: "finance" }, "costs")).toBe(true);
    expect(canWrite({ role: "finance" }, "tenants")).toBe(false);
    expect(canWrite({ role: "tenant" }, "costs")).toBe(false);
  });
});
