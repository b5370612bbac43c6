// The charts, in a chunk of their own: recharts loads only when the usage page is opened.
import { Bar, BarChart, CartesianGrid, Legend, ResponsiveContainer, Tooltip, XAxis, YAxis } from "recharts";

export interface Point {
  key: string;
  input: number;
  output: number;
  requests: number;
}

export default function UsageCharts({ points }: { points: Point[] }) {
  return (
    <div style={{ display: "flex", gap: 24 }} data-testid="charts">
      <ResponsiveContainer width="60%" height={280}>
        <BarChart data={points}>
          <CartesianGrid strokeDasharray="3 3" />
          <XAxis dataKey="key" />
          <YAxis />
          <Tooltip />
          <Legend />
          <Bar dataKey="input" name="input tokens" stackId="t" fill="#1f6feb" isAnimationActive={false} />
          <Bar dataKey="output" name="output tokens" stackId="t" fill="#54aeff" isAnimationActive={false} />
        </BarChart>
      </ResponsiveContainer>
      <ResponsiveContainer width="40%" height={280}>
        <BarChart data={points}>
          <CartesianGrid strokeDasharray="3 3" />
          <XAxis dataKey="key" />
          <YAxis allowDecimals={false} />
          <Tooltip />
          <Bar dataKey="requests" name="requests" fill="#8250df" isAnimationActive={false} />
        </BarChart>
      </ResponsiveContainer>
    </div>
  );
}
