import { describe, expect, it } from "vitest";
import { parseEvents, readEvents } from "../../src/lib/sse";

describe("parseEvents", () => {
  it("splits complete events and keeps the unfinished tail", () => {
    const { events, rest } = parseEvents('data: {"a":1}\n\nevent: progress\ndata: x\n\ndata: par');
    expect(events).toEqual([
      { event: "message", data: '{"a":1}' },
      { event: "progress", data: "x" },
    ]);
    expect(rest).toBe("data: par");
  });

  it("joins multi-line data, ignores comments, accepts CRLF", () => {
    const { events } = parseEvents(": keep-alive\r\ndata: one\r\ndata: two\r\n\r\n");
    expect(events).toEqual([{ event: "message", data: "one\ntwo" }]);
  });

  it("drops events without data", () => {
    expect(parseEvents("event: ping\n\n").events).toEqual([]);
  });
});

describe("readEvents", () => {
  it("reassembles events cut anywhere, even inside a multi-byte character", async () => {
    const text = 'data: {"content":"héllo"}\n\ndata: [DONE]\n\n';
    const bytes = new TextEncoder().encode(text);
    const stream = new ReadableStream<Uint8Array>({
      start(controller) {
        for (let i = 0; i < bytes.length; i += 3) controller.enqueue(bytes.slice(i, i + 3));
        controller.close();
      },
    });
    const got: string[] = [];
    for await (const event of readEvents(stream)) got.push(event.data);
    expect(got).toEqual(['{"content":"héllo"}', "[DONE]"]);
  });
});
